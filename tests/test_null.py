"""The spectrum-matched null of m_K against explicit matrices and a brute-force Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from blockcoupling.coupling import formulas, null
from blockcoupling.jacobians import statistics as coupling


def explicit_samples(
    s_top: np.ndarray, tail: np.ndarray, draws: null.Draws, ks: tuple[int, ...]
) -> np.ndarray:
    """m_K ``(reading, norm, k, n_jac, n_draw)`` from the explicit ``A = L S R^T + t C`` of every
    (Jacobian, draw) (``draws``: leading dims n_jac, n_draw), its diagonal and its corners' sums
    of squares by cumulative sums: the null's evaluation before the per-draw terms.
    """
    a = np.einsum("ndab,nb,ndcb->ndac", draws.left, s_top, draws.right)
    a = a + tail[:, None, None, None] * draws.tail
    diag = np.diagonal(a, axis1=-2, axis2=-1)
    corner = np.diagonal(np.cumsum(np.cumsum(a**2, -1), -2), axis1=-2, axis2=-1)
    return np.array(
        [
            [
                [
                    formulas.mis_coupling_from_stats(diag, corner, s_top[:, None], k, r, nm)
                    for k in ks
                ]
                for nm in formulas.NORMS
            ]
            for r in formulas.READINGS
        ]
    )


def picked(draws: null.Draws, pick: np.ndarray) -> null.Draws:
    return null.Draws(draws.left[pick], draws.right[pick], draws.tail[pick])


def test_draw_terms_equal_the_explicit_null_matrices() -> None:
    rng = np.random.default_rng(1)
    d, k_max, ks = 20, 6, (2, 5, 6)
    s = np.sort(rng.gamma(1.0, size=(5, d)), axis=-1)[:, ::-1]
    draws = null.Draws.sample(d, k_max, (40,), np.random.default_rng(3))
    pick = np.argsort(rng.random((5, 40)), axis=-1)[:, :7]
    tail = null.tail_value(s[:, :k_max], (s**2).sum(-1), d)
    terms = null.DrawTerms.of(iter([draws]), ks, k_max)
    fast = terms.samples(s[:, :k_max], tail, pick, formulas.READINGS, formulas.NORMS, 2.0)
    explicit = explicit_samples(s[:, :k_max], tail, picked(draws, pick), ks)
    np.testing.assert_allclose(fast, explicit, rtol=1e-10)


def sample_in_one_piece(d: int, k_max: int, n: int, rng: np.random.Generator) -> null.Draws:
    """The draws as the definition says, every matrix of all ``n`` draws at once: Gaussian
    heads, then Bartlett's factor F of the tails' Gram matrix (its Gaussians below the diagonal
    row by row, then its chi diagonal) and the full ``F F^T``.
    """
    heads = rng.standard_normal((2, n, k_max, k_max))
    p = 2 * k_max
    if d - k_max >= p:
        below, index = np.tril_indices(p, -1), np.arange(p)
        lower = np.zeros((n, p, p))
        lower[:, below[0], below[1]] = rng.standard_normal((n, len(below[0])))
        lower[:, index, index] = np.sqrt(rng.chisquare(d - k_max - index, size=(n, p)))
    else:
        lower = rng.standard_normal((n, p, d - k_max))
    gram = lower @ null._transposed(lower)
    w12 = np.ascontiguousarray(gram[..., :k_max, k_max:])
    h1, h2 = heads
    inv1 = np.linalg.inv(np.linalg.cholesky(h1 @ null._transposed(h1) + gram[..., :k_max, :k_max]))
    inv2 = np.linalg.inv(np.linalg.cholesky(h2 @ null._transposed(h2) + gram[..., k_max:, k_max:]))
    return null.Draws(inv1 @ h1, inv2 @ h2, inv1 @ w12 @ null._transposed(inv2))


@pytest.mark.parametrize(("d", "k_max"), [(20, 6), (40, 30), (8, 8), (9, 8)])
def test_sampling_in_chunks_draws_the_same_draws(monkeypatch, d, k_max) -> None:
    """Chunked, with the tails' Gram matrix by Bartlett's blocks: the full ``F F^T`` of the
    same random numbers, to rounding.
    """
    monkeypatch.setattr(null, "_SAMPLE_CHUNK", 7)
    one = sample_in_one_piece(d, k_max, 30, np.random.default_rng(3))
    chunked = null.Draws.sample(d, k_max, (5, 6), np.random.default_rng(3))
    for name in null.Draws.names():
        got = getattr(chunked, name).reshape(30, k_max, k_max)
        np.testing.assert_allclose(got, getattr(one, name), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("n_jac", [3, 9])  # 3 x 16 draws <= pool: sampled apart before
def test_every_call_takes_its_draws_from_the_pool(n_jac: int) -> None:
    """Each Jacobian's null is the mean m_K of its own random subset of the pool's draws (the
    generator seeded by ``seed`` samples the pool, ``pick_generator`` the subsets), evaluated
    exactly as the explicit ``A``; a Jacobian with NaN inputs takes none.
    """
    rng = np.random.default_rng(4)
    d, k_max, ks, pool, draws, seed = 30, 8, (3, 8), 64, 16, 7
    s = np.sort(rng.gamma(1.0, size=(n_jac, d)), axis=-1)[:, ::-1]
    s_top, sum2 = s[:, :k_max].copy(), (s**2).sum(-1)
    s_top[1] = np.nan
    mean, se = null.spectrum_null(
        s_top, sum2, d, ks, formulas.READINGS, formulas.NORMS, draws=draws, seed=seed, pool=pool
    )
    pool_draws = sample_in_one_piece(d, k_max, pool, np.random.default_rng(seed))
    valid = np.flatnonzero(np.isfinite(s_top).all(-1))
    generator = null.pick_generator(seed, s_top, sum2)
    pick = np.argsort(generator.random((len(valid), pool)), axis=-1)[:, :draws]
    tail = null.tail_value(s_top[valid], sum2[valid], d)
    values = explicit_samples(s_top[valid], tail, picked(pool_draws, pick), ks)
    np.testing.assert_allclose(mean[..., valid], values.mean(-1), rtol=1e-12)
    np.testing.assert_allclose(se[..., valid], values.std(-1, ddof=1) / np.sqrt(draws), rtol=1e-9)
    assert np.isnan(mean[..., 1]).all() and np.isnan(se[..., 1]).all()


def test_pool_null_is_within_its_error_of_independent_draws() -> None:
    """The null from the pool agrees with the one from independent draws per Jacobian (the
    previous code's for a call of at most pool / draws Jacobians: 30 SmolLM2-sized blocks'
    worth) within their Monte Carlo errors.
    """
    rng = np.random.default_rng(8)
    d, k_max, ks, n_jac = 64, 16, (4, 16), 30
    s = np.sort(rng.gamma(1.0, size=(n_jac, d)), axis=-1)[:, ::-1] ** 2
    s_top, sum2 = s[:, :k_max], (s**2).sum(-1)
    mean, se = null.spectrum_null(s_top, sum2, d, ks, formulas.READINGS, formulas.NORMS)
    own = null.Draws.sample(d, k_max, (n_jac, null.NULL_DRAWS), np.random.default_rng(9))
    values = explicit_samples(s_top, null.tail_value(s_top, sum2, d), own, ks)
    z = (mean - values.mean(-1)) / np.hypot(se, values.std(-1, ddof=1) / np.sqrt(own.left.shape[1]))
    assert np.abs(z).max() < 5
    assert abs(z.mean()) < 1.0


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


@pytest.mark.parametrize("n", [20, 100])
def test_each_jacobian_has_its_own_draws(n: int) -> None:
    """Jacobians of one file share no set of draws: n Jacobians with one spectrum get n
    estimates spread as their standard error says, and their mean has the Monte Carlo error of
    n subsets of ``draws`` from one pool, sd^2 (1 / pool + (1 / draws - 1 / pool) / n) (128
    shared draws gave n equal values: one offset in every model mean)."""
    d, k = 64, 4
    s = np.arange(1, d + 1, dtype=float) ** -0.5
    mean, se = null.spectrum_null(
        np.tile(s[:16], (n, 1)), np.full(n, np.sum(s**2)), d, (k,), ("authors",), ("p",)
    )
    values, se = mean[0, 0, 0], se[0, 0, 0]
    assert np.unique(values).size == n
    # (n - 1) sample variance / sd^2 is chi^2(n - 1); each subset's sd^2 is se^2 (1 - D / P)
    expected = np.mean(se) ** 2 * (1 - null.NULL_DRAWS / null.NULL_POOL)
    low, high = stats.chi2.ppf([5e-5, 1 - 5e-5], n - 1) / (n - 1)
    assert low < np.var(values, ddof=1) / expected < high
    brute, brute_se = haar_null(s, k, 20_000, np.random.default_rng(11))
    # n subsets of D draws (without replacement) of one pool of P: the pool's error and each
    # subset's own, sd^2 (1 / P + (1 / D - 1 / P) / n)
    pool, draws = null.NULL_POOL, null.NULL_DRAWS
    mean_se = np.mean(se) * np.sqrt(draws) * np.sqrt(1 / pool + (1 / draws - 1 / pool) / n)
    assert abs(values.mean() - brute) < 4 * np.hypot(mean_se, brute_se)


def test_block_i_of_two_files_takes_different_draws(monkeypatch) -> None:
    """Two files (trained and twin, two runs) of one width: block i of each takes its own
    subset of the pool (keyed by the file's spectra), so the pool subsets add no Monte Carlo
    error common to them; the same inputs take the same subsets. Before, every call's picks
    came from the generator seeded by ``seed`` alone: block i of every file took one subset.
    """
    seen: list[np.ndarray] = []
    samples = null.DrawTerms.samples

    def spy(self, s_top, tail, pick, *args):
        seen.append(pick.copy())
        return samples(self, s_top, tail, pick, *args)

    monkeypatch.setattr(null.DrawTerms, "samples", spy)
    rng = np.random.default_rng(5)
    d, k_max, n_jac = 30, 8, 4
    files = [np.sort(rng.gamma(1.0, size=(n_jac, d)), axis=-1)[:, ::-1] for _ in range(2)]
    for s in (*files, files[0]):
        null.spectrum_null(
            s[:, :k_max], (s**2).sum(-1), d, (4,), ("authors",), ("p",), draws=16, pool=64
        )
    first, second, again = seen
    assert np.array_equal(first, again)
    for i in range(n_jac):
        assert not np.array_equal(np.sort(first[i]), np.sort(second[i])), i
