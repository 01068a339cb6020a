"""The spectrum-matched null of m_K (docs/science.md), torch-free.

For a Jacobian ``J_i = U S V^T`` (d x d), the null is the expected m_K if the reference bases were
unrelated to J_i: ``A = P^T J_i Q`` with P, Q Haar-random, i.e. ``A = R1 S R2^T`` where
``R1 = P^T U`` and ``R2 = Q^T V`` are independent Haar-random ``K_max x d`` row-orthonormal
matrices. The top-left K x K corner of one draw is a draw at K, so one draw serves every
K <= K_max. It depends on J_i's spectrum only (not on the reference j or the variant).

The spectrum enters as the top K_max singular values exactly and the tail beyond K_max as a flat
tail with its exact sum of squares (``sv_sum2`` minus the top values' squares): the tail's
share of ``A`` is ``t * C`` with ``C = R1[:, K_max:] R2[:, K_max:]^T``, one K_max x K_max matrix
per draw. The tests bound what the flat tail changes against a full-spectrum Monte Carlo.

Seeded Monte Carlo with common random numbers: every Jacobian of one call uses the same draws,
so its standard error is per Jacobian but the errors of different Jacobians are correlated.
Per (Jacobian, draw) the cost is O(K_max^2) per K: ``||A_K||_F^2`` is a quadratic form of the
singular values in per-draw precomputed K_max x K_max matrices, and ``diag A`` a matrix-vector
product.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blockcoupling.coupling.formulas import mis_coupling_from_stats

NULL_DRAWS = 128
NULL_SEED = 0
_CHUNK_FLOATS = 4_000_000  # bound on the (Jacobian, draw, K_max) working arrays


def haar_rows(rng: np.random.Generator, n: int, d: int, k: int) -> np.ndarray:
    """``n`` Haar-random ``(k, d)`` matrices with orthonormal rows, ``(n, k, d)``: the Q of the
    QR of Gaussian ``d x k`` matrices with R's diagonal positive (Mezzadri 2007), computed as
    CholeskyQR2 (``Q = G R^-1``, ``R^T R = G^T G``, then once more on Q for orthonormality to
    rounding): the same Q as LAPACK's QR with the signs fixed, at the cost of batched matrix
    products (LAPACK's batched QR took ~85 ms per 576 x 50 matrix here).
    """
    q = rng.standard_normal((n, d, k))
    for _ in range(2):
        factor = np.linalg.cholesky(np.swapaxes(q, -1, -2) @ q)  # L = R^T
        q = q @ np.linalg.inv(np.swapaxes(factor, -1, -2))
    return np.swapaxes(q, -1, -2)


@dataclass(frozen=True)
class Draws:
    """Per-draw matrices of the null, ``n`` draws at hidden size ``d`` and ``K_max``.

    ``left``, ``right (n, K_max, K_max)``: the head columns of R1 and R2 (basis index a,
    singular index b); ``tail (n, K_max, K_max)``: ``R1[:, K_max:] R2[:, K_max:]^T``.
    """

    left: np.ndarray
    right: np.ndarray
    tail: np.ndarray

    @classmethod
    def sample(cls, d: int, k_max: int, n: int, seed: int) -> Draws:
        """``n`` seeded draws at hidden size ``d`` and ``k_max``."""
        if not 1 <= k_max <= d:
            raise ValueError(f"K_max={k_max} is outside 1..{d} (d)")
        rng = np.random.default_rng(seed)
        r1, r2 = haar_rows(rng, n, d, k_max), haar_rows(rng, n, d, k_max)
        tail = r1[:, :, k_max:] @ np.swapaxes(r2[:, :, k_max:], -1, -2)
        return cls(r1[:, :, :k_max], r2[:, :, :k_max], tail)


def tail_value(s_top: np.ndarray, sv_sum2: np.ndarray, d: int) -> np.ndarray:
    """The flat tail ``t (...)`` whose d - K_max values have the tail's exact sum of squares."""
    n_tail = d - s_top.shape[-1]
    if n_tail == 0:
        return np.zeros(s_top.shape[:-1])
    rest = np.clip(sv_sum2 - np.sum(s_top**2, axis=-1), 0.0, None)
    return np.sqrt(rest / n_tail)


def null_matrices(s_top: np.ndarray, tail: np.ndarray, draws: Draws) -> np.ndarray:
    """The explicit ``A (n_jac, n_draw, K_max, K_max)`` of ``s_top (n_jac, K_max)`` and flat tails
    ``tail (n_jac,)`` (tests and small inputs; ``spectrum_null`` never forms it).
    """
    head = np.einsum("dab,nb,dcb->ndac", draws.left, s_top, draws.right)
    return head + tail[:, None, None, None] * draws.tail[None]


def _draw_samples(
    s_top: np.ndarray,
    tail: np.ndarray,
    draws: Draws,
    ks: tuple[int, ...],
    readings: tuple[str, ...],
    norms: tuple[str, ...],
    p: float,
) -> np.ndarray:
    """m_K of every (Jacobian, draw): ``(reading, norm, k, n_jac, n_draw)``."""
    k_max = s_top.shape[-1]
    n_jac, n_draw = s_top.shape[0], draws.left.shape[0]
    diag = np.einsum("dab,nb->nda", draws.left * draws.right, s_top)
    diag += tail[:, None, None] * np.diagonal(draws.tail, axis1=-2, axis2=-1)[None]
    corner = np.full((n_jac, n_draw, k_max), np.nan)
    for k in ks:
        left, right, c = draws.left[:, :k], draws.right[:, :k], draws.tail[:, :k, :k]
        gram = (np.swapaxes(left, -1, -2) @ left) * (np.swapaxes(right, -1, -2) @ right)
        cross = np.einsum("dab,dac,dcb->db", left, c, right)  # diag(L_K^T C_K R_K)
        quad = np.einsum("nb,dbc,nc->nd", s_top, gram, s_top, optimize=True)
        corner[..., k - 1] = (
            quad
            + 2.0 * tail[:, None] * (s_top @ cross.T)
            + tail[:, None] ** 2 * np.sum(c**2, axis=(-2, -1))[None]
        )
    s_b = s_top[:, None, :]
    return np.stack(
        [
            np.stack(
                [
                    np.stack([mis_coupling_from_stats(diag, corner, s_b, k, r, nm, p) for k in ks])
                    for nm in norms
                ]
            )
            for r in readings
        ]
    )


def spectrum_null(
    s_top: np.ndarray,
    sv_sum2: np.ndarray,
    d: int,
    ks: tuple[int, ...],
    readings: tuple[str, ...],
    norms: tuple[str, ...],
    p: float = 2.0,
    draws: int = NULL_DRAWS,
    seed: int = NULL_SEED,
) -> tuple[np.ndarray, np.ndarray]:
    """Null m_K and its Monte Carlo standard error, each ``(reading, norm, k, ...)``.

    ``s_top (..., K_max)``: each Jacobian's top singular values (descending); ``sv_sum2 (...)``:
    the sum of squares of its full spectrum; ``d``: the hidden size. NaN where the inputs are.
    """
    if draws < 2:
        raise ValueError(f"metrics.null_draws must be at least 2, got {draws}")
    shape, k_max = s_top.shape[:-1], s_top.shape[-1]
    s_flat = s_top.reshape(-1, k_max)
    sum2 = np.asarray(sv_sum2, dtype=float).reshape(-1)
    valid = np.isfinite(s_flat).all(axis=-1) & np.isfinite(sum2)
    mean = np.full((len(readings), len(norms), len(ks), s_flat.shape[0]), np.nan)
    se = mean.copy()
    sample = Draws.sample(d, k_max, draws, seed)
    index = np.flatnonzero(valid)
    chunk = max(1, _CHUNK_FLOATS // (draws * k_max))
    for start in range(0, len(index), chunk):
        rows = index[start : start + chunk]
        s = s_flat[rows]
        values = _draw_samples(
            s, tail_value(s, sum2[rows], d), sample, tuple(ks), readings, norms, p
        )
        mean[..., rows] = values.mean(axis=-1)
        se[..., rows] = values.std(axis=-1, ddof=1) / np.sqrt(draws)
    out_shape = (len(readings), len(norms), len(ks), *shape)
    return mean.reshape(out_shape), se.reshape(out_shape)
