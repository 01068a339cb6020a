"""Config errors that used to surface in a job after training or extraction are refused when
the DAG is built (workflow.check_config), in one line naming the key and the fix."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import REPO, SCHEMA
from snakemake.utils import validate

from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.k_warnings import k_warnings


def smoke(**changes: dict) -> dict:
    """config/smoke.yaml with sections updated (one level deep), schema-validated, without its
    GGUF model (these checks are about the trained runs; a packaged model's below).
    """
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    config.pop("models")
    for section, values in changes.items():
        config[section] = {**config.get(section, {}), **values}
    validate(config, SCHEMA)
    return config


def refusal(config: dict) -> str:
    with pytest.raises(ConfigError) as error:
        check_config(copy.deepcopy(config), REPO)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_k_max_above_a_trained_runs_width_is_refused() -> None:
    message = refusal(smoke(extract={"k_max": 40}))
    assert "extract.k_max=40" in message and "d_model=32" in message
    assert "train.runs.fixed_size-f0.5-s0" in message and "at most 32" in message


def test_k_max_equal_to_the_width_passes() -> None:
    plan = check_config(smoke(extract={"k_max": 32}), REPO)
    assert plan.extraction.k_max == plan.extract["k_max"] == 32


def test_token_layers_outside_a_trained_runs_depth_are_refused() -> None:
    message = refusal(smoke(extract={"token_layers": [99]}))
    assert "extract.token_layers [99]" in message and "1..2" in message
    # the emergence run has 3 blocks: layer 3 fits it but not the fixed-size runs' 2
    message = refusal(smoke(extract={"token_layers": [3]}))
    assert "'fixed_size-f0.5-s0-final'" in message and "[3]" in message
    message = refusal(smoke(extract={"token_layers": [-3]}))
    assert "[-3]" in message


def test_token_layers_counted_from_the_end_that_fit_pass() -> None:
    check_config(smoke(extract={"token_layers": [-2, 1, 2]}), REPO)


def test_packaged_model_meta_shape_is_checked() -> None:
    config = smoke(extract={"token_layers": [5]})
    config["models"] = {
        "pkg": {
            "source": {"package": "blockcoupling", "file": "__init__.py"},
            "meta": {"n_layers": 4, "d_model": 64},
        }
    }
    config["figures"] = {}
    validate(config, SCHEMA)
    message = refusal(config)
    assert "models.pkg.meta" in message and "1..4" in message
    config["extract"]["token_layers"] = [-1]
    config["extract"]["k_max"] = 80
    message = refusal(config)
    assert "d_model=64" in message and "models.pkg.meta" in message


def test_evaluated_score_without_the_evaluate_rule_is_refused() -> None:
    message = refusal(smoke(evaluate={"enabled": False}))
    assert "evaluate.score='bits_per_byte'" in message and "evaluate.enabled" in message
    message = refusal(smoke(evaluate={"enabled": False, "score": "mc_accuracy"}))
    assert "evaluate.score='mc_accuracy'" in message


def test_leaderboard_score_needs_a_meta_score() -> None:
    message = refusal(smoke(evaluate={"enabled": False, "score": "score"}))
    assert "meta.score" in message
    config = yaml.safe_load((REPO / "config.yaml").read_text())  # pretrained models with meta
    config["evaluate"] = {"enabled": False, "score": "score"}
    validate(config, SCHEMA)
    assert "meta.score" in refusal(config)
    config["models"]["smollm2-135m"]["meta"]["score"] = 1.0
    plan = check_config(config, REPO)
    assert not plan.evaluate


def test_vit_k_max_and_token_layers_against_its_shape() -> None:
    config = smoke()
    config["vit"]["extract"]["k_max"] = 9  # embed_dim 8
    assert "exceeds embed_dim=8" in refusal(config)
    config = smoke()
    config["vit"]["extract"]["token_layers"] = [3]  # depth 2
    assert "vit.extract.token_layers [3]" in refusal(config)


def test_k_above_an_eighth_of_the_width_is_a_warning_naming_the_key() -> None:
    plan = check_config(smoke(), REPO)  # K 4, 8 of d = 32 LMs; vit.ks 2, 4 of embed_dim 8
    lines = k_warnings(plan)
    assert [line.split(" is more")[0] for line in lines] == [
        "metrics.ks: K=8",
        "vit.ks: K=2",
        "vit.ks: K=4",
    ]
    assert "d=32: K/d=0.25" in lines[0] and "prefer K <= 4" in lines[0]
    quiet = smoke(metrics={"ks": [2, 4]}, stats={"k": 4})
    quiet["vit"]["ks"], quiet["vit"]["k"] = [1], 1
    assert k_warnings(check_config(quiet, REPO)) == []
