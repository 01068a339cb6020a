"""extract.jacobian_prompts: Jacobians on the first prompts, forward-pass measures on all."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import xarray as xr
from tiny_models import ARCHITECTURES, CharTokenizer

from blockcoupling.jacobians.datasets import merge_shards
from blockcoupling.jacobians.extract import ExtractConfig, extract
from blockcoupling.jacobians.options import PromptText

PROMPTS = [PromptText(f"q{i}", "test", text) for i, text in enumerate(["hello", "abc", "lemon"])]
CONFIG = ExtractConfig(k_max=3, token_layers=(-1,), token_prompts=2, jacobian_prompts=1)


@pytest.fixture(scope="module")
def model():
    return ARCHITECTURES["llama"]()


def run(model, prompts, config) -> dict[str, xr.Dataset]:
    return extract(model, CharTokenizer(), prompts, config, progress=False)


def test_only_the_first_prompts_get_jacobians_and_every_prompt_a_trajectory(model) -> None:
    subset = run(model, PROMPTS, CONFIG)
    every = run(model, PROMPTS, replace(CONFIG, jacobian_prompts=None))
    assert list(subset["depth"]["prompt"].values) == ["q0"]
    assert list(subset["spectra"]["prompt"].values) == ["q0"]
    assert list(subset["tokens"]["prompt"].values) == ["q0"]  # token families within them
    xr.testing.assert_identical(
        subset["depth"].drop_attrs(), every["depth"].isel(prompt=[0]).drop_attrs()
    )
    assert subset["trajectories"].sizes["prompt"] == 3
    for name, variable in every["trajectories"].data_vars.items():
        np.testing.assert_array_equal(subset["trajectories"][name].values, variable.values)


def test_shards_past_the_jacobian_prompts_merge_to_one_jobs_files(model) -> None:
    whole = run(model, PROMPTS, CONFIG)
    first = run(model, PROMPTS[:1], CONFIG.for_shard(0))
    rest = run(model, PROMPTS[1:], CONFIG.for_shard(1))
    assert CONFIG.for_shard(1).jacobian_prompts == 0 and not rest["depth"].data_vars
    for kind in ("depth", "spectra", "trajectories"):
        merged = merge_shards([first[kind], rest[kind]])
        xr.testing.assert_allclose(merged.drop_attrs(), whole[kind].drop_attrs())


def test_jacobian_prompts_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="extract.jacobian_prompts"):
        ExtractConfig(jacobian_prompts=-1)
