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

Seeded Monte Carlo with independent draws per Jacobian (``Draws.sample``): the Monte Carlo errors
of different Jacobians are independent, so they average out in a model's mean over blocks and
prompts and enter its bootstrap over prompts (one set of draws shared by every Jacobian of a file
left one offset per width in every absolute excess). A draw needs only R1's and R2's head
columns and C, which are functions of Gaussian heads and one 2 K_max x 2 K_max Wishart matrix
(the Gram matrix of the two tails): O(K_max^3) per draw, whatever d. Per (Jacobian, draw) the
explicit ``A`` (K_max^3) gives every K's corner by cumulative sums.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from blockcoupling.coupling.formulas import mis_coupling_from_stats

NULL_DRAWS = 128
NULL_SEED = 0
NULL_POOL = 4096  # draws sampled per call at most: more Jacobians draw theirs from this pool
_CHUNK_FLOATS = 4_000_000  # bound on the (Jacobian, draw, K_max, K_max) working arrays


def _transposed(x: np.ndarray) -> np.ndarray:
    """``x`` with its last two axes swapped, contiguous (numpy's stacked matmul runs BLAS only on
    contiguous operands: a strided one was ~15x slower here).
    """
    return np.ascontiguousarray(np.swapaxes(x, -1, -2))


def _tail_gram(rng: np.random.Generator, shape: tuple[int, ...], p: int, m: int) -> np.ndarray:
    """``X X^T`` of a Gaussian ``(p, m)`` matrix X per leading index, ``(*shape, p, p)``: a
    Wishart(m, I_p) matrix, by Bartlett's decomposition when m >= p (O(p^3)), else explicitly.
    """
    if m == 0:
        return np.zeros((*shape, p, p))
    if m < p:
        x = rng.standard_normal((*shape, p, m))
        return x @ _transposed(x)
    lower = np.tril(rng.standard_normal((*shape, p, p)), -1)
    index = np.arange(p)
    lower[..., index, index] = np.sqrt(rng.chisquare(m - index, size=(*shape, p)))
    return lower @ _transposed(lower)


@dataclass(frozen=True)
class Draws:
    """Draws of the null at hidden size ``d`` and ``K_max``, leading dims ``(...)`` (one set per
    Jacobian and draw).

    ``left``, ``right (..., K_max, K_max)``: the head columns of R1 and R2 (basis index a,
    singular index b); ``tail (..., K_max, K_max)``: ``R1[:, K_max:] R2[:, K_max:]^T``.
    """

    left: np.ndarray
    right: np.ndarray
    tail: np.ndarray

    @classmethod
    def sample(cls, d: int, k_max: int, shape: tuple[int, ...], rng: np.random.Generator) -> Draws:
        """Draws of shape ``shape`` at hidden size ``d`` and ``k_max``: with ``G1 = [H1, T1]``
        and ``G2 = [H2, T2]`` Gaussian ``K_max x d`` (heads H: K_max columns), ``R = L^-1 G``
        (``L L^T = G G^T``, Cholesky) has Haar-distributed orthonormal rows (right-invariant);
        the tails enter only through the Gram matrix ``W`` of ``[T1; T2]`` (``_tail_gram``).
        """
        if not 1 <= k_max <= d:
            raise ValueError(f"K_max={k_max} is outside 1..{d} (d)")
        heads = rng.standard_normal((2, *shape, k_max, k_max))
        gram = _tail_gram(rng, tuple(shape), 2 * k_max, d - k_max)
        w1, w2 = gram[..., :k_max, :k_max], gram[..., k_max:, k_max:]
        w12 = np.ascontiguousarray(gram[..., :k_max, k_max:])
        l1 = np.linalg.cholesky(heads[0] @ _transposed(heads[0]) + w1)
        l2 = np.linalg.cholesky(heads[1] @ _transposed(heads[1]) + w2)
        inv1, inv2 = np.linalg.inv(l1), np.linalg.inv(l2)
        tail = inv1 @ w12 @ _transposed(inv2)
        return cls(inv1 @ heads[0], inv2 @ heads[1], tail)


def tail_value(s_top: np.ndarray, sv_sum2: np.ndarray, d: int) -> np.ndarray:
    """The flat tail ``t (...)`` whose d - K_max values have the tail's exact sum of squares."""
    n_tail = d - s_top.shape[-1]
    if n_tail == 0:
        return np.zeros(s_top.shape[:-1])
    rest = np.clip(sv_sum2 - np.sum(s_top**2, axis=-1), 0.0, None)
    return np.sqrt(rest / n_tail)


def null_matrices(s_top: np.ndarray, tail: np.ndarray, draws: Draws) -> np.ndarray:
    """The explicit ``A (n_jac, n_draw, K_max, K_max)`` of ``s_top (n_jac, K_max)`` and flat tails
    ``tail (n_jac,)``, each Jacobian with its own draws (``draws``: leading dims n_jac, n_draw).
    """
    head = np.einsum("ndab,nb,ndcb->ndac", draws.left, s_top, draws.right, optimize=True)
    return head + tail[:, None, None, None] * draws.tail


def _draw_samples(
    s_top: np.ndarray,
    tail: np.ndarray,
    draws: Draws,
    ks: tuple[int, ...],
    readings: tuple[str, ...],
    norms: tuple[str, ...],
    p: float,
) -> np.ndarray:
    """m_K of every (Jacobian, draw): ``(reading, norm, k, n_jac, n_draw)``, from the explicit
    ``A`` of each (its diagonal, and its K x K corners' sums of squares by cumulative sums).
    """
    a = null_matrices(s_top, tail, draws)
    diag = np.diagonal(a, axis1=-2, axis2=-1)
    corner = np.diagonal(np.cumsum(np.cumsum(a**2, axis=-1), axis=-2), axis1=-2, axis2=-1)
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


@functools.lru_cache(maxsize=1)
def _pool(d: int, k_max: int, pool: int, seed: int) -> tuple[Draws, dict]:
    """The ``pool`` draws a generator seeded by ``seed`` samples first, and its state after
    them: every call at one (d, K_max) shares them (a job measuring several models of one
    width samples them once; ~3 s at d = 64, K_max = 50). Read only.
    """
    rng = np.random.default_rng(seed)
    return Draws.sample(d, k_max, (pool,), rng), rng.bit_generator.state


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
    pool: int = NULL_POOL,
) -> tuple[np.ndarray, np.ndarray]:
    """Null m_K and its Monte Carlo standard error, each ``(reading, norm, k, ...)``.

    ``s_top (..., K_max)``: each Jacobian's top singular values (descending); ``sv_sum2 (...)``:
    the sum of squares of its full spectrum; ``d``: the hidden size. NaN where the inputs are.
    Each Jacobian gets its own ``draws`` draws (one generator seeded by ``seed``), independent
    of the other Jacobians' while ``n_jac x draws <= pool``; beyond, the call samples ``pool``
    draws once and each Jacobian takes ``draws`` distinct ones of them at random: the Monte
    Carlo error a model's mean shares is then that of ``pool`` draws (sd / sqrt(pool)), not of
    ``draws`` (the stored ``se`` is the per-Jacobian one).
    """
    if draws < 2:
        raise ValueError(f"metrics.null_draws must be at least 2, got {draws}")
    shape, k_max = s_top.shape[:-1], s_top.shape[-1]
    s_flat = s_top.reshape(-1, k_max)
    sum2 = np.asarray(sv_sum2, dtype=float).reshape(-1)
    valid = np.isfinite(s_flat).all(axis=-1) & np.isfinite(sum2)
    mean = np.full((len(readings), len(norms), len(ks), s_flat.shape[0]), np.nan)
    se = mean.copy()
    rng = np.random.default_rng(seed)
    index = np.flatnonzero(valid)
    shared = None
    if len(index) * draws > pool:  # the pool, and the generator as it leaves it
        shared, state = _pool(d, k_max, pool, seed)
        rng.bit_generator.state = state
    chunk = max(1, _CHUNK_FLOATS // (draws * k_max * k_max))
    for start in range(0, len(index), chunk):
        rows = index[start : start + chunk]
        s = s_flat[rows]
        if shared is None:
            sample = Draws.sample(d, k_max, (len(rows), draws), rng)
        else:
            pick = np.argsort(rng.random((len(rows), pool)), axis=-1)[:, :draws]
            sample = Draws(shared.left[pick], shared.right[pick], shared.tail[pick])
        values = _draw_samples(
            s, tail_value(s, sum2[rows], d), sample, tuple(ks), readings, norms, p
        )
        mean[..., rows] = values.mean(axis=-1)
        se[..., rows] = values.std(axis=-1, ddof=1) / np.sqrt(draws)
    out_shape = (len(readings), len(norms), len(ks), *shape)
    return mean.reshape(out_shape), se.reshape(out_shape)
