"""The token families compute every ``J_{t1 t2}`` once, by the VJPs of its output token, and
share it between the fixed-output and fixed-input families (no JVPs on the whole prompt).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import ARCHITECTURES, CharTokenizer

from blockcoupling.jacobians import extract as extract_module
from blockcoupling.jacobians.engine import JacobianEngine
from blockcoupling.jacobians.extract import ExtractConfig, extract
from blockcoupling.jacobians.spectral import top_k
from blockcoupling.jacobians.statistics import cross_stats

CONFIG = ExtractConfig(k_max=4, token_layers=(1, -1), token_prompts=1)
TEXT = "hello"  # 5 tokens


def counted(monkeypatch) -> dict[str, int]:
    calls = {"output_token": 0}
    original = JacobianEngine.output_token

    def output_token(self, layer, t2):
        calls["output_token"] += 1
        return original(self, layer, t2)

    def input_token(self, layer, t1):
        raise AssertionError("the token families took a JVP batch")

    monkeypatch.setattr(JacobianEngine, "output_token", output_token)
    monkeypatch.setattr(JacobianEngine, "input_token", input_token)
    return calls


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return ARCHITECTURES["llama"]()


def test_one_vjp_batch_per_output_token_and_layer(model, monkeypatch) -> None:
    calls = counted(monkeypatch)
    held = extract(model, CharTokenizer(), [TEXT], CONFIG, progress=False)["tokens"]
    assert calls["output_token"] == 2 * 5  # layers x output tokens: each batch used once
    monkeypatch.setattr(extract_module, "TOKEN_HOLD_BYTES", 0)  # too big to hold: the VJPs again
    calls["output_token"] = 0
    again = extract(model, CharTokenizer(), [TEXT], CONFIG, progress=False)["tokens"]
    assert calls["output_token"] == 2 * 2 * 5
    d = model.config.hidden_size
    monkeypatch.setattr(
        extract_module, "TOKEN_HOLD_BYTES", 6 * d * d * 8
    )  # t2 = 0, 1 of both layers
    calls["output_token"] = 0
    part = extract(model, CharTokenizer(), [TEXT], CONFIG, progress=False)["tokens"]
    assert calls["output_token"] == 2 * 5 + 2 * 3  # the groups t2 = 2, 3, 4 again
    for name in held.data_vars:
        assert np.array_equal(held[name].values, again[name].values, equal_nan=True), name
        assert np.array_equal(held[name].values, part[name].values, equal_nan=True), name


def test_fixed_input_matches_the_jvp_jacobians(model) -> None:
    """Fixed input at t1 = 1 against the statistics of forward-mode Jacobians (the old path)."""
    tokens = extract(model, CharTokenizer(), [TEXT], CONFIG, progress=False)["tokens"]
    engine = JacobianEngine(model, dict(CharTokenizer()(TEXT)))
    layer, t1 = 3, 1
    jacs = engine.input_token(layer, t1)[t1:5]  # J_{1 t2}, t2 = 1..4, by JVPs
    factors = top_k(jacs, 4)
    diag, corner = cross_stats(jacs, factors.v, factors.u)  # the vju variant
    stored = tokens.isel(prompt=0).sel(layer=layer, layer_ref=layer, variant="vju", token_in=t1)
    got_d = stored["fixed_in_diag"].isel(token=slice(1, 5), token_ref=slice(1, 5)).values
    got_c = stored["fixed_in_corner"].isel(token=slice(1, 5), token_ref=slice(1, 5)).values
    # reverse- and forward-mode Jacobians differ by rounding, which the top-K bases of nearly
    # equal singular values amplify (measured 1.3e-8 absolute on values near 0.04)
    np.testing.assert_allclose(np.abs(got_d), np.abs(diag.numpy()), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got_c, corner.numpy(), rtol=1e-5, atol=1e-7)
