"""Training grids (workflow.expand_grids): run names, groups, families and the metadata that
becomes coords along ``model``."""

from __future__ import annotations

import pytest

from blockcoupling import workflow as wf
from blockcoupling.combine import META_FIELDS
from blockcoupling.schedule import TrainConfig


def _config(grids: dict) -> dict:
    return {"train": {"grids": grids}, "models": {}}


def test_grid_names_groups_and_recipe_metadata() -> None:
    grid = {
        "axes": {"data_fraction": [0.1, 1.0], "weight_decay": [0.0, 0.3], "seed": [0, 1]},
        "base": {"n_layers": 4, "d_model": 64, "learning_rate": 0.003},
        "models": {"checkpoints": False},
    }
    config = wf.expand_grids(_config({"fixed_size": grid}))
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
    models = wf.expand_grids(_config(grids))["models"]
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
        wf.ConfigError, match=r"^train\.grids\.g \(run g-f.*\): data_fraction must be in \(0, 1\]"
    ):
        wf.expand_grids(_config({"g": grid}))
