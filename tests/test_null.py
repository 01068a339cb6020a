"""The spectrum-matched null of m_K against explicit matrices and a brute-force Monte Carlo."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from blockcoupling.coupling import formulas, null
from blockcoupling.jacobians import statistics as coupling


def test_fast_path_equals_the_explicit_null_matrices() -> None:
    rng = np.random.default_rng(1)
    d, k_max, ks = 20, 6, (2, 6)
    s = np.sort(rng.gamma(1.0, size=(5, d)), axis=-1)[:, ::-1]
    draws = null.Draws.sample(d, k_max, (5, 7), np.random.default_rng(3))
    tail = null.tail_value(s[:, :k_max], (s**2).sum(-1), d)
    fast = null._draw_samples(s[:, :k_max], tail, draws, ks, formulas.READINGS, formulas.NORMS, 2.0)
    a = null.null_matrices(s[:, :k_max], tail, draws)
    diag = np.diagonal(a, axis1=-2, axis2=-1)
    corner = np.diagonal(np.cumsum(np.cumsum(a**2, -1), -2), axis1=-2, axis2=-1)
    for (r, reading), (n, norm), (i, k) in itertools.product(
        enumerate(formulas.READINGS), enumerate(formulas.NORMS), enumerate(ks)
    ):
        explicit = formulas.mis_coupling_from_stats(
            diag, corner, s[:, None, :k_max], k, reading, norm
        )
        np.testing.assert_allclose(fast[r, n, i], explicit, rtol=1e-10)


def brute_force(s: np.ndarray, k: int, n: int, seed: int) -> tuple[float, float]:
    """Mean and SE of m_K of J_i = Q0 S Q1^T against an unrelated J_j (QR of Gaussians)."""
    rng, d = np.random.default_rng(seed), len(s)
    values = []
    for _ in range(n):
        q = [np.linalg.qr(rng.standard_normal((d, d)))[0] for _ in range(4)]
        jac_i = torch.from_numpy(q[0] @ np.diag(s) @ q[1].T)
        jac_j = torch.from_numpy(q[2] @ np.diag(np.linspace(2.0, 1.0, d)) @ q[3].T)
        values.append(coupling.mis_coupling(jac_i, jac_j, k))
    return float(np.mean(values)), float(np.std(values) / np.sqrt(n))


@pytest.mark.parametrize(
    ("d", "k_max", "s"),
    [
        (32, 16, np.arange(1, 33) ** -1.5),  # power law, short tail (the ViT)
        (32, 16, np.r_[np.ones(6), np.zeros(26)]),  # rank-deficient
        (24, 8, np.ones(24)),  # flat
    ],
)
def test_null_equals_a_full_spectrum_brute_force(d, k_max, s) -> None:
    """Top K_max values plus a flat tail of the exact sum of squares vs the full spectrum."""
    for k in (4, k_max):
        mean, se = null.spectrum_null(
            s[:k_max], (s**2).sum(), d, (k,), ("authors",), ("p",), draws=2000, seed=1
        )
        brute, brute_se = brute_force(s, k, 400, 2)
        assert abs(mean.item() - brute) < 4 * np.hypot(se.item(), brute_se), (d, k)


def haar_null(s: np.ndarray, k: int, n: int, rng: np.random.Generator) -> tuple[float, float]:
    """Brute force: mean and SE of m_K (authors, p = 2) of ``diag(s)`` (the full spectrum) in
    ``n`` explicit Haar-random K-frames P, Q (QR of Gaussians, signs fixed): A = P^T diag(s) Q.
    """
    d = len(s)

    def frames() -> np.ndarray:
        q, r = np.linalg.qr(rng.standard_normal((n, d, k)))
        return q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[:, None, :]

    a = np.swapaxes(frames(), -1, -2) @ (s[:, None] * frames())
    values = np.linalg.norm(np.abs(a) - np.diag(s[:k]), axis=(-2, -1)) / np.linalg.norm(s[:k])
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(n))


@pytest.mark.parametrize("n", [20, 100])  # 20 x 128 draws: all independent; 100: from the pool
def test_each_jacobian_has_its_own_draws(n: int) -> None:
    """Jacobians of one file share no set of draws: n Jacobians with one spectrum get n
    estimates spread as their standard error says, and their mean has the Monte Carlo error of
    min(n x draws, pool) draws (128 shared draws gave n equal values: one offset in every model
    mean)."""
    d, k = 64, 4
    s = np.arange(1, d + 1, dtype=float) ** -0.5
    mean, se = null.spectrum_null(
        np.tile(s[:16], (n, 1)), np.full(n, np.sum(s**2)), d, (k,), ("authors",), ("p",)
    )
    values, se = mean[0, 0, 0], se[0, 0, 0]
    assert np.unique(values).size == n
    assert np.std(values, ddof=1) == pytest.approx(np.mean(se), rel=0.25)
    brute, brute_se = haar_null(s, k, 20_000, np.random.default_rng(11))
    used = min(n * null.NULL_DRAWS, null.NULL_POOL)
    mean_se = np.mean(se) * np.sqrt(null.NULL_DRAWS / used)
    assert abs(values.mean() - brute) < 4 * np.hypot(mean_se, brute_se)
