"""The report's opening text names every model a config measures, trained here or loaded."""

from __future__ import annotations

from pathlib import Path

import yaml

from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.report_text import report_models
from blockcoupling.pipeline.schema_check import validate_config

ROOT = Path(__file__).resolve().parents[1]


def plan_of(config_file: str):
    config = yaml.safe_load((ROOT / config_file).read_text())
    validate_config(config, ROOT / "schemas" / "config.schema.yaml")
    return check_config(config, ROOT, check_memory=False)


def test_the_smoke_config_lists_its_trained_models():
    """The smoke config's report read "Models: ." (its trained models unnamed): every model,
    the tiny GGUF it loads and every grid model, is named with how it was measured."""
    plan = plan_of("config/smoke.yaml")
    text = report_models(plan)
    assert set(plan.models) == {
        "fixed_size-f0.5-s0-final",
        "fixed_size-f0.5-s1-final",
        "fixed_size-f1.0-s0-final",
        "fixed_size-f1.0-s1-final",
        "emergence-s0",
        "tiny-gguf",
    }
    for name in plan.models:
        assert f"``{name}``" in text
    assert text.startswith("loaded, 1 at final weights, each beside its random-init twin: ")
    assert "trained here (fixed_size), 4 at final weights, each beside its random-init twin" in text
    assert "(one shared twin: identical initialisations)" in text
    assert "trained here (emergence), 1 at checkpoints 0, 2, 8: ``emergence-s0``" in text


def test_the_default_config_lists_loaded_and_trained_models():
    plan = plan_of("config.yaml")
    text = report_models(plan)
    assert text.startswith("loaded, 1 at final weights, each beside its random-init twin: ")
    assert all(f"``{name}``" in text for name in plan.models)
    assert "10 at checkpoints 0, 16, 64, 128, 256, 384, 512, 768, 1000" in text
