"""The checked Plan of a config (check_config as a library call): the shipped configs pass, schema
and library defaults agree, the statistics' K, unknown keys, the params that re-run jobs, the
targets, the combined token files, and the figure registry the rules read without matplotlib."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, SCHEMA
from snakemake.utils import validate

from blockcoupling.coupling.metrics import MetricConfig
from blockcoupling.jacobians.options import ExtractConfig, science_params
from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.figure_registry import FIGURES
from blockcoupling.pipeline.plan import Plan
from blockcoupling.stats.selection import Selection


def checked(config: dict) -> Plan:
    config = copy.deepcopy(config)
    validate(config, SCHEMA)
    return check_config(config, REPO)


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


@pytest.mark.parametrize("name", ["config.yaml", "config/smoke.yaml", "config/paper.yaml"])
def test_shipped_configs_pass_the_checks(name: str) -> None:
    plan = checked(load(name))
    assert plan.models and plan.selection["k"] in plan.metric.ks


def test_schema_defaults_equal_the_library_defaults() -> None:
    config = {"prompts": {"sets": {"s": {"file": "x.jsonl"}}}, "extract": {"prompt_set": "s"}}
    config["metrics"] = {"ks": [10]}
    validate(config, SCHEMA)
    measure = ExtractConfig.from_config(config["extract"])
    assert measure == ExtractConfig(k_max=measure.k_max)  # every other field at its default
    assert measure.k_max == 50
    metric = MetricConfig.from_config(config["metrics"])
    assert (metric.readings, metric.norms, metric.p) == (
        MetricConfig().readings,
        MetricConfig().norms,
        MetricConfig().p,
    )
    assert config["extract"]["device"] == "auto"
    assert config["stats"]["k"] is None and config["evaluate"]["enabled"] is True


def test_statistics_follow_the_first_k_when_stats_has_no_section() -> None:
    config = load("config/smoke.yaml")
    config.pop("stats")
    config["metrics"]["ks"] = [4, 8]
    plan = checked(config)
    assert plan.selection == Selection(k=4, reading="authors", variant="ujv", norm="p")


def test_unknown_extract_key_names_it() -> None:
    with pytest.raises(ValueError, match="extract: unknown key 'k_maxx'"):
        ExtractConfig.from_config({"k_maxx": 3})
    with pytest.raises(ValueError, match="metrics: unknown key 'kz'"):
        MetricConfig.from_config({"kz": [3]})


def test_run_only_keys_are_not_science_params() -> None:
    section = {"prompt_set": "s", "k_max": 5, "threads": 4, "device": "cuda", "chunk_size": 64}
    assert science_params(section) == {"k_max": 5}


def test_targets_hold_every_documented_output() -> None:
    plan = checked(load("config/smoke.yaml"))
    targets = plan.targets()
    assert "results/extract/fixed_size-f0.5-s0-final/random/spectra.nc" in targets  # the twin
    assert not [t for t in targets if "f1.0-s0-final/random" in t]  # measured once, above
    assert not [t for t in targets if t.startswith("results/evaluate/") and "/random" in t]
    assert "results/metrics/emergence-s0/8/token_coupling.nc" in targets
    assert "results/evaluate/fixed_size-f0.5-s1-final/final.nc" in targets
    assert not [t for t in targets if t.startswith("results/evaluate/emergence-s0/")]  # history


def test_figure_registry_is_read_without_importing_figures() -> None:
    code = (
        "import sys; from blockcoupling.pipeline.figure_registry import FIGURES as r; "
        "assert 'depth_heatmaps' in r and 'matplotlib' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    missing = [n for n in FIGURES if not (REPO / "report" / f"{n}.rst").is_file()]
    assert not missing, f"figures without a caption: {missing}"


def test_a_model_without_token_families_is_left_out_of_the_combined_tokens() -> None:
    """A model with token_families: false writes an empty token file; the combined tokens
    dataset gathers the other models only (its inputs name none of that model's files), and
    there is none when no model has token families."""
    from dataclasses import replace

    config = load("config.yaml")
    assert config["models"]["smollm2-135m"]["token_families"] is False  # depth only
    plan = checked(config)
    tokens = plan.combine_inputs("init", "tokens")
    assert tokens and not [f for f in tokens if "/smollm2-135m/" in f]
    assert [f for f in tokens if "/fixed_size-f0.7943-s19-final/" in f]
    assert "results/metrics/smollm2-135m/final/token_coupling.nc" in plan.targets()
    assert "results/metrics/smollm2-135m/final/coupling.nc" in plan.combine_inputs(
        "init", "coupling"
    )
    models = {n: replace(e, token_families=False) for n, e in plan.models.items()}
    assert "tokens" not in replace(plan, models=models).combined_names("init")
