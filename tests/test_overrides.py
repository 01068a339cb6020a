"""Nested ``--config`` overrides reach the schema with their types, and ``--configfile a b``
layers config files (later keys win, nested sections merged)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, SCHEMA, snakemake

from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.overrides import coerce_overrides
from blockcoupling.pipeline.schema_check import validate_config


def smoke_with(overrides: dict[str, Any]) -> dict[str, Any]:
    """The smoke config with ``overrides`` merged in as Snakemake merges ``--config``."""
    from snakemake.utils import update_config

    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    update_config(config, overrides)
    return config


def base_loaded(text: str) -> Any:
    """A nested ``--config`` value as Snakemake parses it: YAML's BaseLoader, every leaf a str."""
    return yaml.load(text, Loader=yaml.BaseLoader)


def test_nested_string_leaves_get_the_schema_types() -> None:
    overrides = {
        "stats": base_loaded("{k: 8, n_boot: 30}"),
        "metrics": base_loaded("{ks: [4, 8], p: 1.5, null_draws: 16}"),
        "random_init": base_loaded("{enabled: false}"),
        "extract": base_loaded("{svd: {tol: 1e-3}, jacobian_prompts: null}"),
    }
    config = smoke_with(overrides)
    assert config["stats"]["k"] == "8"  # what Snakemake hands the Snakefile
    validate_config(config, SCHEMA, overrides=overrides)
    assert config["stats"] == {**config["stats"], "k": 8, "n_boot": 30}
    assert config["metrics"]["ks"] == [4, 8] and config["metrics"]["p"] == 1.5
    assert config["metrics"]["null_draws"] == 16
    assert config["random_init"]["enabled"] is False
    assert config["extract"]["svd"]["tol"] == 1e-3
    assert config["extract"]["jacobian_prompts"] is None


def test_without_the_overrides_the_strings_are_refused_as_before() -> None:
    config = smoke_with({"stats": base_loaded("{k: 8}")})
    with pytest.raises(ConfigError, match="stats.k: '8' is not of type 'integer'"):
        validate_config(config, SCHEMA)


def test_text_that_is_no_number_still_fails_the_schema_in_one_line() -> None:
    overrides = {"stats": base_loaded("{k: five}")}
    with pytest.raises(ConfigError, match="stats.k: 'five' is not of type 'integer'"):
        validate_config(smoke_with(overrides), SCHEMA, overrides=overrides)


def test_only_leaves_from_the_command_line_change() -> None:
    """A value a config file quotes stays a string (the schema then names it)."""
    schema = yaml.safe_load(SCHEMA.read_text())
    config = smoke_with({"stats": {"k": "8", "n_boot": "30"}})
    assert coerce_overrides(config, {"stats": {"n_boot": "30"}}, schema) == 1
    assert config["stats"]["k"] == "8" and config["stats"]["n_boot"] == 30


def test_a_string_the_schema_wants_stays_a_string() -> None:
    """A revision that reads as a number is still a revision name."""
    schema = yaml.safe_load(SCHEMA.read_text())
    source = {"hub": "EleutherAI/pythia-14m", "revision": "1000"}
    overrides = {"models": {"p": {"source": dict(source)}}}
    config = smoke_with(overrides)
    coerce_overrides(config, overrides, schema)
    assert config["models"]["p"]["source"]["revision"] == "1000"


def snakemake_dry_run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return snakemake(folder, "-n", "--quiet", "rules", *args, configfile=False, timeout=600)


@pytest.mark.slow
def test_a_nested_config_override_reaches_the_workflow_typed(tmp_path: Path) -> None:
    smoke = str(REPO / "config" / "smoke.yaml")
    ok = snakemake_dry_run(tmp_path, "--configfile", smoke, "--config", "stats={k: 8, n_boot: 30}")
    assert ok.returncode == 0, ok.stderr
    # k = 5 passes the schema as an integer and meets the cross-field check, which names the
    # smoke file's metrics.ks: the override was merged into it, not replacing it
    bad = snakemake_dry_run(tmp_path, "--configfile", smoke, "--config", "stats={k: 5}")
    assert bad.returncode != 0
    assert "config error: stats.k=5 is not in metrics.ks [4, 8]; add it there" in bad.stderr


@pytest.mark.slow
def test_config_files_layer_later_keys_winning(tmp_path: Path) -> None:
    layer = tmp_path / "layer.yaml"
    layer.write_text("stats:\n  k: 5\n")
    smoke = str(REPO / "config" / "smoke.yaml")
    result = snakemake_dry_run(tmp_path, "--configfile", smoke, str(layer))
    assert result.returncode != 0
    assert "config error: stats.k=5 is not in metrics.ks [4, 8]; add it there" in result.stderr
    layer.write_text("metrics:\n  ks: [4, 5, 8]\nstats:\n  k: 5\n")
    assert snakemake_dry_run(tmp_path, "--configfile", smoke, str(layer)).returncode == 0
