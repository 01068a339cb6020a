"""The spectrum-matched null of m_K (docs/science.md), torch-free.

For a Jacobian ``J_i = U S V^T`` (d x d), the null is the expected m_K if the reference bases were
unrelated to J_i: ``A = P^T J_i Q`` with P, Q Haar-random, i.e. ``A = R1 S R2^T`` where
``R1 = P^T U`` and ``R2 = Q^T V`` are independent Haar-random ``K_max x d`` row-orthonormal
matrices. The top-left K x K corner of one draw is a draw at K, so one draw serves every
K <= K_max. It depends on J_i's spectrum only (not on the reference j or the variant). Its
expectation has no closed form (m_K is the square root of a quadratic form in the Haar
matrices, and the authors' reading takes absolute values; only the second moment has one), so
it is a seeded Monte Carlo.

The spectrum enters as the top K_max singular values exactly and the tail beyond K_max as a flat
tail with its exact sum of squares (``sv_sum2`` minus the top values' squares): the tail's
share of ``A`` is ``t * C`` with ``C = R1[:, K_max:] R2[:, K_max:]^T``, one K_max x K_max matrix
per draw. The tests bound what the flat tail changes against a full-spectrum Monte Carlo.

The draws: a pool of ``NULL_POOL`` draws per process, hidden size d, K_max and seed (sampled once,
``_pool``), from which each Jacobian takes its own ``draws`` distinct draws at random, the picks
keyed by the call's inputs (``pick_generator``): the Monte Carlo errors of different Jacobians,
of one file or of two, are mostly independent, so they average out in a model's mean over blocks
and prompts; what every file of one width shares is the pool's error (sd / sqrt(pool)). A draw
needs only R1's and R2's head columns and C, which are functions of Gaussian heads and one
2 K_max x 2 K_max Wishart matrix (the Gram matrix of the two tails, from Bartlett's factor by
its K_max x K_max blocks): O(K_max^3) per draw, whatever d. Per draw the pool keeps what m_K
needs of it at every K of the call: ``diag A`` is linear in ``[s; t]`` and ``||A_K||_F^2`` a
quadratic form in it, so a (Jacobian, draw) costs O(K_max^2) per K, and one product serves all
Jacobians of a call.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from blockcoupling.coupling.formulas import mis_coupling_from_stats

NULL_DRAWS = 128
NULL_SEED = 0
NULL_POOL = 4096  # draws per process, width, K_max and seed; each Jacobian takes its own of them
NULL_PICKS = "each Jacobian's draws from the pool, keyed by null_seed and BLAKE2b of the spectra"
_CHUNK_FLOATS = 4_000_000  # bound on the working arrays of (Jacobian, draw) and (Jacobian, pool)
_SAMPLE_CHUNK = 256  # draws turned into Haar heads at a time (bounds the working arrays)


def _transposed(x: np.ndarray) -> np.ndarray:
    """``x`` with its last two axes swapped, contiguous (numpy's stacked matmul runs BLAS only on
    contiguous operands: a strided one was ~15x slower here).
    """
    return np.ascontiguousarray(np.swapaxes(x, -1, -2))


def _tail_gaussians(rng: np.random.Generator, n: int, p: int, m: int) -> np.ndarray:
    """The random numbers of ``n`` factors ``F (p, q)`` with ``F F^T`` Wishart(m, I_p) (the Gram
    matrix of a Gaussian ``(p, m)`` matrix), ``(n, ...)``: when m >= p, Bartlett's
    lower-triangular factor's p (p - 1) / 2 Gaussians below the diagonal (row by row) then its
    diagonal's p chi values; else the Gaussian matrix itself, flattened (``_tail_factor``).
    """
    if m < p:
        return rng.standard_normal((n, p * m))
    below = rng.standard_normal((n, p * (p - 1) // 2))
    return np.concatenate([below, np.sqrt(rng.chisquare(m - np.arange(p), size=(n, p)))], -1)


def _tail_factor(numbers: np.ndarray, p: int, m: int) -> np.ndarray:
    """``F (n, p, min(p, m))`` from its random numbers ``(n, ...)`` (``_tail_gaussians``)."""
    if m < p:
        return numbers.reshape(len(numbers), p, m)
    below, index = np.tril_indices(p, -1), np.arange(p)
    lower = np.zeros((len(numbers), p, p))
    lower[:, below[0], below[1]] = numbers[:, : len(below[0])]
    lower[:, index, index] = numbers[:, len(below[0]) :]
    return lower


def _tail_grams(f: np.ndarray, k_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks ``W11, W22, W12 (..., K_max, K_max)`` of ``W = F F^T`` (``F (..., 2 K_max,
    q)``); for Bartlett's square factor ``[[F11, 0], [F21, F22]]`` by its blocks (half the
    products of the full ``F F^T``).
    """
    f1, f2 = f[..., :k_max, :], f[..., k_max:, :]
    if f.shape[-1] != f.shape[-2]:
        return f1 @ _transposed(f1), f2 @ _transposed(f2), f1 @ _transposed(f2)
    f11 = np.ascontiguousarray(f1[..., :k_max])
    f21, f22 = np.ascontiguousarray(f2[..., :k_max]), np.ascontiguousarray(f2[..., k_max:])
    w22 = f21 @ _transposed(f21) + f22 @ _transposed(f22)
    return f11 @ _transposed(f11), w22, f11 @ _transposed(f21)


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
        """Draws of shape ``shape`` at hidden size ``d`` and ``k_max`` (``draw_chunks``)."""
        chunks = list(draw_chunks(d, k_max, shape, rng))
        left, right, tail = (np.concatenate([getattr(c, n) for c in chunks]) for n in cls.names())
        return cls(*(x.reshape(*shape, k_max, k_max) for x in (left, right, tail)))

    @staticmethod
    def names() -> tuple[str, str, str]:
        """The fields' names, in order."""
        return ("left", "right", "tail")


def draw_chunks(
    d: int, k_max: int, shape: tuple[int, ...], rng: np.random.Generator
) -> Iterator[Draws]:
    """Draws of shape ``shape`` (flattened, in chunks of ``_SAMPLE_CHUNK``) at hidden size ``d``
    and ``k_max``: with ``G1 = [H1, T1]`` and ``G2 = [H2, T2]`` Gaussian ``K_max x d`` (heads H:
    K_max columns), ``R = L^-1 G`` (``L L^T = G G^T``, Cholesky) has Haar-distributed orthonormal
    rows (right-invariant); the tails enter only through the Gram matrix ``W`` of ``[T1; T2]``
    (``_tail_factor``). Every Gaussian is drawn first, in one order, so the chunking changes no
    draw.
    """
    if not 1 <= k_max <= d:
        raise ValueError(f"K_max={k_max} is outside 1..{d} (d)")
    n = int(np.prod(shape, dtype=int))
    heads = rng.standard_normal((2, n, k_max, k_max))
    numbers = _tail_gaussians(rng, n, 2 * k_max, d - k_max)
    for start in range(0, n, _SAMPLE_CHUNK):
        part = slice(start, start + _SAMPLE_CHUNK)
        w1, w2, w12 = _tail_grams(_tail_factor(numbers[part], 2 * k_max, d - k_max), k_max)
        h1, h2 = heads[0, part], heads[1, part]
        inv1 = np.linalg.inv(np.linalg.cholesky(h1 @ _transposed(h1) + w1))
        inv2 = np.linalg.inv(np.linalg.cholesky(h2 @ _transposed(h2) + w2))
        yield Draws(inv1 @ h1, inv2 @ h2, inv1 @ w12 @ _transposed(inv2))


def tail_value(s_top: np.ndarray, sv_sum2: np.ndarray, d: int) -> np.ndarray:
    """The flat tail ``t (...)`` whose d - K_max values have the tail's exact sum of squares."""
    n_tail = d - s_top.shape[-1]
    if n_tail == 0:
        return np.zeros(s_top.shape[:-1])
    rest = np.clip(sv_sum2 - np.sum(s_top**2, axis=-1), 0.0, None)
    return np.sqrt(rest / n_tail)


@dataclass(frozen=True)
class DrawTerms:
    """What m_K needs of each draw of a pool at the K list ``ks``, as coefficients in ``x``.

    ``x = [s_top; t]`` is the Jacobian's (``A = L S R^T + t C``; ``L, R, C``: a ``Draws``').

    ``diag (pool, K_max, K_max + 1)``: ``[L * R | diag C]``, so that ``diag A = diag @ x``;
    ``corner (Q, len(ks), pool)``, ``Q = K_max (K_max + 1) / 2 + K_max + 1``: per K, the
    quadratic form ``||A_K||_F^2 = corner[:, k]^T [sym(s s^T); 2 t s; t^2]``, whose first block is
    ``G_K = (L_K^T L_K) * (R_K^T R_K)`` on and above its diagonal (off-diagonal entries doubled;
    ``L_K = L[:K]``), then ``diag(L_K^T C_K R_K)`` and ``||C_K||_F^2``.
    """

    ks: tuple[int, ...]
    diag: np.ndarray
    corner: np.ndarray

    @classmethod
    def of(cls, chunks: Iterator[Draws], ks: tuple[int, ...], k_max: int) -> DrawTerms:
        """The terms of every draw of ``chunks`` (leading dim: draws), in order."""
        upper = np.triu_indices(k_max)
        double = np.where(upper[0] == upper[1], 1.0, 2.0)
        diags, corners = [], []
        for draws in chunks:
            left, right, tail = draws.left, draws.right, draws.tail
            diag_c = np.diagonal(tail, axis1=-2, axis2=-1)[..., None]
            diags.append(np.concatenate([left * right, diag_c], axis=-1))
            per_k = []
            for k in ks:
                lk, rk, ck = left[:, :k], right[:, :k], tail[:, :k, :k]
                gram = (_transposed(lk) @ lk) * (_transposed(rk) @ rk)
                cross = np.sum(lk * (ck @ rk), axis=-2)  # diag(L_K^T C_K R_K)
                per_k.append(
                    np.concatenate(
                        [
                            gram[:, upper[0], upper[1]] * double,
                            cross,
                            np.sum(ck**2, axis=(-2, -1))[:, None],
                        ],
                        axis=-1,
                    ).T
                )
            corners.append(np.stack(per_k, axis=1))
        return cls(
            tuple(ks), np.concatenate(diags), np.ascontiguousarray(np.concatenate(corners, -1))
        )

    def samples(
        self,
        s_top: np.ndarray,
        tail: np.ndarray,
        pick: np.ndarray,
        readings: tuple[str, ...],
        norms: tuple[str, ...],
        p: float,
    ) -> np.ndarray:
        """m_K of every (Jacobian, draw) ``(reading, norm, k, n_jac, n_draw)`` of ``s_top (n_jac,
        K_max)`` and flat tails ``tail (n_jac,)``, Jacobian i with the pool's draws
        ``pick[i] (n_draw,)``.
        """
        k_max = s_top.shape[-1]
        x = np.concatenate([s_top, tail[:, None]], axis=-1)
        step = max(1, _CHUNK_FLOATS // (pick.shape[1] * self.diag[0].size))
        diag = np.concatenate(  # (n_jac, n_draw, K_max), a few Jacobians' draws at a time
            [
                np.einsum("ndab,nb->nda", self.diag[pick[i : i + step]], x[i : i + step])
                for i in range(0, len(pick), step)
            ]
        )
        upper = np.triu_indices(k_max)
        vector = np.concatenate(
            [
                (s_top[:, :, None] * s_top[:, None, :])[:, upper[0], upper[1]],
                2.0 * tail[:, None] * s_top,
                tail[:, None] ** 2,
            ],
            axis=-1,
        )
        forms = (vector @ self.corner.reshape(len(self.corner), -1)).reshape(
            len(pick), len(self.ks), -1
        )
        corner = np.full((*diag.shape[:-1], k_max), np.nan)
        for c, k in enumerate(self.ks):
            corner[..., k - 1] = np.take_along_axis(forms[:, c], pick, axis=-1)
        s_b = s_top[:, None, :]
        return np.stack(
            [
                np.stack(
                    [
                        np.stack(
                            [
                                mis_coupling_from_stats(diag, corner, s_b, k, r, nm, p)
                                for k in self.ks
                            ]
                        )
                        for nm in norms
                    ]
                )
                for r in readings
            ]
        )


@functools.lru_cache(maxsize=1)
def _pool(d: int, k_max: int, pool: int, seed: int, ks: tuple[int, ...]) -> DrawTerms:
    """The terms of the ``pool`` draws a generator seeded by ``seed`` samples: every call at one
    (d, K_max, ks) shares them (a job measuring several models of one width samples them
    once). Read only.
    """
    return DrawTerms.of(draw_chunks(d, k_max, (pool,), np.random.default_rng(seed)), ks, k_max)


def pick_generator(seed: int, s_top: np.ndarray, sv_sum2: np.ndarray) -> np.random.Generator:
    """The generator of a call's picks from the pool, keyed by ``seed`` and the call's inputs
    (BLAKE2b of ``s_top`` and ``sv_sum2`` as float64): block i of two files (trained and twin,
    two runs) takes different subsets, so the picks add no error common to them; the same
    inputs take the same picks.
    """
    digest = hashlib.blake2b(digest_size=16)
    for values in (s_top, sv_sum2):
        digest.update(np.ascontiguousarray(values, dtype=np.float64).tobytes())
    words = np.frombuffer(digest.digest(), dtype=np.uint32)
    return np.random.default_rng([seed, *words.tolist()])


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
    Each Jacobian takes ``draws`` distinct draws at random from the process's ``pool`` draws
    (``_pool``, sampled by the generator seeded by ``seed``; the picks by ``pick_generator``,
    keyed by the call's inputs): the Monte Carlo error a model's mean shares is that of
    ``pool`` draws (sd / sqrt(pool)), not of ``draws`` (the stored ``se`` is the per-Jacobian
    one), and that pool error is common to every file of one width.
    """
    if not 2 <= draws <= pool:
        raise ValueError(f"metrics.null_draws must be in 2..{pool}, got {draws}")
    shape, k_max = s_top.shape[:-1], s_top.shape[-1]
    too_big = [k for k in ks if not 1 <= k <= k_max]
    if too_big:
        raise ValueError(f"K={too_big[0]} is outside 1..{k_max} (K_max of the stored statistics)")
    s_flat = s_top.reshape(-1, k_max)
    sum2 = np.asarray(sv_sum2, dtype=float).reshape(-1)
    valid = np.isfinite(s_flat).all(axis=-1) & np.isfinite(sum2)
    mean = np.full((len(readings), len(norms), len(ks), s_flat.shape[0]), np.nan)
    se = mean.copy()
    index = np.flatnonzero(valid)
    if len(index) == 0:
        return mean.reshape(*mean.shape[:3], *shape), se.reshape(*se.shape[:3], *shape)
    terms = _pool(d, k_max, pool, seed, tuple(ks))
    rng = pick_generator(seed, s_flat, sum2)
    chunk = max(1, _CHUNK_FLOATS // (len(ks) * pool))  # the quadratic forms of a chunk
    for start in range(0, len(index), chunk):
        rows = index[start : start + chunk]
        s = s_flat[rows]
        pick = np.argsort(rng.random((len(rows), pool)), axis=-1)[:, :draws]
        values = terms.samples(s, tail_value(s, sum2[rows], d), pick, readings, norms, p)
        mean[..., rows] = values.mean(axis=-1)
        se[..., rows] = values.std(axis=-1, ddof=1) / np.sqrt(draws)
    out_shape = (len(readings), len(norms), len(ks), *shape)
    return mean.reshape(out_shape), se.reshape(out_shape)
