"""Training grids (workflow.expand_grids): run names, groups, families and the metadata that
becomes coords along ``model``."""

from __future__ import annotations

import pytest

from blockcoupling.files.combine import META_FIELDS
from blockcoupling.lm.training.schedule import TrainConfig
from blockcoupling.pipeline.entries import FINAL, RANDOM, model_entries
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.grids import expand_grids


def _config(grids: dict) -> dict:
    return {"train": {"grids": grids}, "models": {}}


def test_grid_names_groups_and_recipe_metadata() -> None:
    grid = {
        "axes": {"data_fraction": [0.1, 1.0], "weight_decay": [0.0, 0.3], "seed": [0, 1]},
        "base": {"n_layers": 4, "d_model": 64, "learning_rate": 0.003},
        "models": {"checkpoints": False},
    }
    config = expand_grids(_config({"fixed_size": grid}))
    runs = config["train"]["runs"]
    assert len(runs) == 8 and "fixed_size-f0.1-wd0.3-s1" in runs
    assert runs["fixed_size-f0.1-wd0.3-s1"] == {
        "n_layers": 4,
        "d_model": 64,
        "learning_rate": 0.003,
        "data_fraction": 0.1,
        "weight_decay": 0.3,
        "seed": 1,
        "n_heads": 2,
    }
    models = config["models"]
    assert sorted(models) == sorted(f"{run}-final" for run in runs)  # no checkpoint suites
    meta = models["fixed_size-f0.1-wd0.3-s1-final"]["meta"]
    assert set(meta) == set(META_FIELDS) - {"score"}
    assert (meta["data_fraction"], meta["weight_decay"], meta["learning_rate"], meta["seed"]) == (
        0.1,
        0.3,
        0.003,
        1,
    )
    assert meta["family"] == "fixed_size" and meta["group"] == "fixed_size-f0.1-wd0.3"
    assert meta["params"] == TrainConfig(n_layers=4, d_model=64, n_heads=2).n_params()
    groups = {m["meta"]["group"] for m in models.values()}
    assert len(groups) == 4  # the seeds of a configuration share its group, nothing else does


def test_recipe_defaults_reach_the_metadata_and_families_can_be_shared() -> None:
    grids = {
        "emergence": {"axes": {"learning_rate": [0.001, 0.003], "seed": [0]}},
        "extra": {"axes": {"seed": [5]}, "family": "emergence", "models": {"final": False}},
    }
    models = expand_grids(_config(grids))["models"]
    assert sorted(models) == [
        "emergence-lr0.001-s0",
        "emergence-lr0.001-s0-final",
        "emergence-lr0.003-s0",
        "emergence-lr0.003-s0-final",
        "extra-s5",
    ]
    meta = models["extra-s5"]["meta"]
    assert meta["family"] == "emergence" and meta["group"] == "extra"
    assert (meta["data_fraction"], meta["weight_decay"], meta["learning_rate"]) == (
        TrainConfig.data_fraction,
        TrainConfig.weight_decay,
        TrainConfig.learning_rate,
    )
    assert models["emergence-lr0.003-s0"]["token_families"] is False


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.1])
def test_a_bad_data_fraction_names_the_grid(fraction: float) -> None:
    grid = {"axes": {"data_fraction": [0.5, fraction]}}
    with pytest.raises(
        ConfigError, match=r"^train\.grids\.g \(run g-f.*\): data_fraction must be in \(0, 1\]"
    ):
        expand_grids(_config({"g": grid}))


def _tiny_tokenizer():
    from blockcoupling.lm.training.data import train_tokenizer

    return train_tokenizer(["to be or not to be, that is the question"], 300)


def test_every_recipe_field_outside_the_twin_key_leaves_the_twin_unchanged() -> None:
    """A run's random-init twin is rebuilt from its saved model config and tokenizer (its text):
    a field outside ``twin_key`` must change neither, one inside must change the key.
    """
    from dataclasses import fields

    from blockcoupling.lm.training.data import split_texts
    from blockcoupling.lm.training.train import model_config

    tokenizer = _tiny_tokenizer()
    base = TrainConfig(n_layers=2, d_model=64, n_heads=2, max_train_chars=2000)
    changed = {
        "n_layers": 3, "d_model": 128, "n_heads": 4, "intermediate_size": 64,
        "context_length": 64, "batch_size": 4, "learning_rate": 0.01, "warmup_fraction": 0.1,
        "min_lr_fraction": 0.5, "weight_decay": 0.3, "grad_clip": 0.5, "total_steps": 50,
        "seed": 7, "split_seed": 3, "vocab_size": 512, "n_even_checkpoints": 3,
        "checkpoint_steps": [0, 10, 1000], "n_val_windows": 8, "max_train_chars": 3000,
        "data_fraction": 0.5,
    }  # fmt: skip
    assert set(changed) == {f.name for f in fields(TrainConfig)}  # a new field must be judged
    for name, value in changed.items():
        other = TrainConfig(**{**base.__dict__, name: value})
        same_twin = (
            model_config(other, tokenizer).to_dict() == model_config(base, tokenizer).to_dict()
            and split_texts(other)[0] == split_texts(base)[0]
            and other.vocab_size == base.vocab_size
        )
        assert (other.twin_key() == base.twin_key()) == same_twin, name


def test_runs_with_identical_twins_measure_one_twin() -> None:
    grids = {
        "fixed_size": {
            "axes": {"data_fraction": [0.1, 1.0], "weight_decay": [0.0, 0.3], "seed": [0, 1]},
            "base": {"n_layers": 2, "d_model": 64},
            "models": {"checkpoints": False},
        },
        "wide": {"axes": {"seed": [0, 1]}, "base": {"n_layers": 2, "d_model": 128}},
    }
    entries = model_entries(expand_grids(_config(grids)))
    twins = {name: e.measured_as(RANDOM) for name, e in entries.items() if RANDOM in e.steps}
    assert set(twins.values()) == {"fixed_size-f0.1-wd0.0-s0-final", "wide-s0-final"}
    assert all(twins[n] == "wide-s0-final" for n in twins if n.startswith("wide"))
    for name, entry in entries.items():
        own = entry.measured_as(RANDOM) == name
        assert (RANDOM in entry.measured_steps) == (own and RANDOM in entry.steps)
        assert entry.measured_as(FINAL) == name
    assert entries["wide-s1"].measured_steps == entries["wide-s1"].steps  # checkpoint suites


def test_paired_axes_make_one_independent_run_per_seed() -> None:
    """``paired``: the i-th data fraction goes with the i-th seed (3 runs, not 9), each run its
    own group (an independent unit of the CR1 tests); unequal lengths are refused."""
    grid = {
        "axes": {"data_fraction": [0.01, 0.1, 1.0], "seed": [10, 11, 12]},
        "paired": True,
        "base": {"n_layers": 4, "d_model": 64},
        "models": {"checkpoints": False},
    }
    config = expand_grids(_config({"fixed_size": grid}))
    assert sorted(config["train"]["runs"]) == [
        "fixed_size-f0.01-s10",
        "fixed_size-f0.1-s11",
        "fixed_size-f1.0-s12",
    ]
    groups = {m["meta"]["group"] for m in config["models"].values()}
    assert len(groups) == 3
    grid["axes"]["seed"] = [10, 11]
    with pytest.raises(ConfigError, match="paired axes need equal lengths"):
        expand_grids(_config({"fixed_size": grid}))
