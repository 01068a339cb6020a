"""The workflow's config check in process: each bad config of the minimal run is one
ConfigError line naming the key and the fix, from ``validate_config`` (the schema) or
``check_config`` (every cross-field constraint), which the Snakefile runs before any job and
prints as ``config error: ...`` (tests/test_workflow.py runs one through Snakemake: one line, no
traceback, no job)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from conftest import REPO, SCHEMA
from test_workflow import MINIMAL, PROMPTS

from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.plan import Plan
from blockcoupling.pipeline.schema_check import validate_config


def check(folder: Path, config: dict, monkeypatch: pytest.MonkeyPatch) -> Plan:
    """What the Snakefile does with ``config`` run from ``folder`` (relative files: there)."""
    monkeypatch.chdir(folder)
    validate_config(config, SCHEMA)
    return check_config(config, REPO)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "prompts.jsonl").write_text("\n".join(PROMPTS) + "\n")
    return tmp_path


def test_the_minimal_config_passes(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert check(folder, copy.deepcopy(MINIMAL), monkeypatch).models.keys() == {
        "tiny",
        "tiny-steps",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["extract"].update(k_maxx=3), "k_maxx"),
        (lambda c: c["metrics"].update(ks=[2, 9]), "K=9 > extract.k_max=4"),
        (lambda c: c["models"].update(bad={"source": {"hub": "x/y", "package": "p"}}), "source"),
        (
            lambda c: c["models"].update(
                bad={"source": {"package": "no_such_package_xyz", "file": "m.gguf"}}
            ),
            "package 'no_such_package_xyz' is not installed",
        ),
        (
            lambda c: c["models"].update(bad={"source": {"path": "no/such/folder"}}),
            "models.bad.source: model path 'no/such/folder' does not exist",
        ),
        (lambda c: c["extract"].update(prompt_set="nope"), "prompt_set 'nope'"),
        (lambda c: c["prompts"]["sets"]["mini"].update(file="missing.jsonl"), "missing.jsonl"),
        (lambda c: c.update(models={}), "no models"),
        (lambda c: c["stats"].update(k=3), "stats.k=3 is not in metrics.ks [2, 4]"),
        (
            lambda c: c["stats"].update(variant="vju") or c["extract"].update(variants=["ujv"]),
            "stats.variant='vju'",
        ),
        (lambda c: c.update(figures={"token_model": "nope"}), "figures.token_model 'nope'"),
        (lambda c: c["train"]["runs"]["tiny"].update(n_headz=2), "n_headz"),
        (
            lambda c: c["train"]["runs"]["tiny"].update(n_heads=3),
            "train.runs.tiny: d_model 16 is not divisible by n_heads 3",
        ),
        (
            lambda c: c["train"]["runs"].update(
                {"tiny_b": {"n_layers": 1}, "tiny-b": {"n_layers": 1}}
            ),
            "collide",
        ),
    ],
)
def test_bad_config_is_one_config_error_naming_the_key(
    folder: Path, monkeypatch: pytest.MonkeyPatch, change, message: str
) -> None:
    config = copy.deepcopy(MINIMAL)
    change(config)
    with pytest.raises(ConfigError) as error:
        check(folder, config, monkeypatch)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_hub_id_without_organisation_is_accepted(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = copy.deepcopy(MINIMAL)
    config["models"]["gpt2"] = {"source": {"hub": "gpt2"}}
    assert check(folder, config, monkeypatch).models["gpt2"].source == {"hub": "gpt2"}


def test_non_utf8_prompt_file_is_one_clear_line(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (folder / "prompts.jsonl").write_bytes('{"text": "caf\u00e9 au lait"}\n'.encode("latin-1"))
    with pytest.raises(ConfigError) as error:
        check(folder, copy.deepcopy(MINIMAL), monkeypatch)
    text = str(error.value)
    assert "is not UTF-8 text" in text and "prompts.jsonl" in text and "\n" not in text
