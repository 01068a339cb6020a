"""The coupling metric m_K (science.md, "Coupling metric") and its sufficient statistics."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from blockcoupling.coupling import formulas
from blockcoupling.jacobians import statistics as coupling
from blockcoupling.jacobians.spectral import svd

READINGS, VARIANTS, NORMS = formulas.READINGS, formulas.VARIANTS, formulas.NORMS


def random_orthogonal(
    d: int, generator: torch.Generator, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).to(dtype)


def rotation(d: int, theta: float, i: int = 0, j: int = 1) -> torch.Tensor:
    """Rotation by ``theta`` in the (e_i, e_j) plane, identity elsewhere."""
    r = torch.eye(d, dtype=torch.float64)
    c, s = math.cos(theta), math.sin(theta)
    r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
    return r


def gaussian(d: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def metric_from_basis(
    jac_i: torch.Tensor, left: torch.Tensor, right: torch.Tensor, s_i: torch.Tensor, reading: str
) -> float:
    """m_K (p = 2) from explicit bases through ``matrix_stats`` and ``mis_coupling_from_stats``."""
    diag, corner = coupling.matrix_stats(left.mT @ jac_i @ right)
    k = left.shape[-1]
    return float(
        formulas.mis_coupling_from_stats(
            diag.numpy(), corner.numpy(), s_i.double().numpy(), k, reading
        )
    )


# --- m_K(J, J) = 0 ---------------------------------------------------------------------------


@pytest.mark.parametrize("reading", READINGS)
@pytest.mark.parametrize("norm", NORMS)
def test_self_coupling_is_zero(reading: str, norm: str) -> None:
    jac = gaussian(32, seed=1)
    for k in (1, 5, 32):
        assert coupling.mis_coupling(
            jac, jac, k, reading=reading, variant="ujv", norm=norm
        ) == pytest.approx(0.0, abs=1e-10)
    jac32 = jac.float()
    assert coupling.mis_coupling(
        jac32, jac32, 10, reading=reading, variant="ujv", norm=norm
    ) == pytest.approx(0.0, abs=1e-5)


def test_self_coupling_vju_is_not_zero_in_general() -> None:
    """``vju`` reads J in the swapped bases ``V^T J U``; for a non-symmetric J that is not
    diagonal."""
    jac = gaussian(16, seed=2)
    assert coupling.mis_coupling(jac, jac, 5, reading="offdiag", variant="vju") > 0.05
    sym = jac @ jac.T  # symmetric PSD: U = V, so vju is zero as well
    assert coupling.mis_coupling(sym, sym, 5, reading="offdiag", variant="vju") == pytest.approx(
        0.0, abs=1e-10
    )


# --- signs of singular vectors -------------------------------------------------------------------


def test_paired_sign_flips_leave_J_and_metric_unchanged() -> None:
    """Flipping (u_a, v_a) together is another valid SVD of the same J_j; A -> D A D
    (D = diag of signs), so |A|, diag(A)^2 and the off-diagonal entries' squares, hence both
    readings, are unchanged."""
    d, k = 12, 6
    gen = torch.Generator().manual_seed(3)
    u, v = random_orthogonal(d, gen), random_orthogonal(d, gen)
    s = torch.linspace(5.0, 0.5, d, dtype=torch.float64)
    jac_j = u @ torch.diag(s) @ v.T
    jac_i = gaussian(d, seed=4)
    s_i = svd(jac_i).s[:k]
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0, 1.0] + [1.0] * (d - k), dtype=torch.float64)
    u_f, v_f = u * signs, v * signs
    torch.testing.assert_close(u_f @ torch.diag(s) @ v_f.T, jac_j, rtol=0, atol=1e-12)
    for reading in READINGS:
        ref = metric_from_basis(jac_i, u[:, :k], v[:, :k], s_i, reading)
        flipped = metric_from_basis(jac_i, u_f[:, :k], v_f[:, :k], s_i, reading)
        assert flipped == pytest.approx(ref, rel=1e-12)
        assert ref > 0.1


def test_unpaired_sign_flip_of_reference_basis() -> None:
    """Flipping u_a alone (not an SVD of J_j any more) gives A -> D A: row a changes sign.
    Both readings only see |A| entrywise (authors) or squares of off-diagonal entries (offdiag), so
    both are unchanged; a signed reading ``||A - S||_F`` would not be (it is why |.| is there)."""
    d, k = 10, 4
    jac = gaussian(d, seed=5)
    f = svd(jac)
    u, v, s = f.u[:, :k], f.v[:, :k], f.s[:k]
    u_f = u.clone()
    u_f[:, 1] *= -1
    for reading in READINGS:
        # the statistics path takes a square root of a difference of sums: ~1e-8 near zero
        assert metric_from_basis(jac, u_f, v, s, reading) == pytest.approx(0.0, abs=1e-7)
        other = gaussian(d, seed=6)
        s_o = svd(other).s[:k]
        assert metric_from_basis(other, u_f, v, s_o, reading) == pytest.approx(
            metric_from_basis(other, u, v, s_o, reading), rel=1e-12
        )
    a_flipped = u_f.mT @ jac @ v
    signed = torch.linalg.matrix_norm(a_flipped - torch.diag(s)) / torch.linalg.vector_norm(s)
    assert float(signed) == pytest.approx(
        2 * float(s[1]) / float(torch.linalg.vector_norm(s)), rel=1e-10
    )


# --- a hand-built pair ----------------------------------------------------------------------------


def test_hand_built_rotation_pair() -> None:
    """J_i = diag(3, 2, 1, 0.5); J_j = R diag(10, 5, 0.3, 0.1) R^T with R a rotation by theta in the
    (e_0, e_1) plane. J_j's bases are U_j = V_j = R (up to paired signs), so with c, s = cos, sin:
    A[:2, :2] = R2^T diag(3, 2) R2 = [[3c^2 + 2s^2, -cs], [-cs, 3s^2 + 2c^2]] and A[2, 2] = 1.
    Hence  authors: || |A| - S ||_F = sqrt(2) (3 - 2) |s|
                    (diag deviations -s^2, +s^2; off-diag cs)
           offdiag: || A - diag A ||_F = sqrt(2) (3 - 2) |c s|
    for K = 2 and K = 3 (the third direction is aligned), over ||S_K||_2 or trace S_K."""
    d, theta = 4, 0.3
    s_i = torch.tensor([3.0, 2.0, 1.0, 0.5], dtype=torch.float64)
    jac_i = torch.diag(s_i)
    r = rotation(d, theta)
    jac_j = r @ torch.diag(torch.tensor([10.0, 5.0, 0.3, 0.1], dtype=torch.float64)) @ r.T
    c, s = math.cos(theta), math.sin(theta)
    numerators = {"authors": math.sqrt(2) * abs(s), "offdiag": math.sqrt(2) * abs(c * s)}
    for k in (2, 3):
        norms = {"p": float(torch.linalg.vector_norm(s_i[:k])), "trace": float(s_i[:k].sum())}
        for reading, norm, variant in itertools.product(READINGS, NORMS, VARIANTS):
            expected = numerators[reading] / norms[norm]
            got = coupling.mis_coupling(
                jac_i, jac_j, k, reading=reading, variant=variant, norm=norm
            )
            assert got == pytest.approx(expected, rel=1e-10), (k, reading, norm, variant)
    # a different p: ||S_2||_1 = 5 = trace
    got = coupling.mis_coupling(jac_i, jac_j, 2, reading="authors", norm="p", p=1.0)
    assert got == pytest.approx(numerators["authors"] / 5.0, rel=1e-10)


def test_hand_built_non_symmetric_pair_distinguishes_variants() -> None:
    """J_j = R_theta diag(10, 5) R_phi^T (d = 2): U_j = R_theta, V_j = R_phi. For J_i = diag(3, 2),
    ujv: A = R_theta^T J_i R_phi;  vju: A = R_phi^T J_i R_theta = (ujv A)^T with the angles
    swapped."""
    theta, phi = 0.4, -0.9
    jac_i = torch.diag(torch.tensor([3.0, 2.0], dtype=torch.float64))
    jac_j = (
        rotation(2, theta)
        @ torch.diag(torch.tensor([10.0, 5.0], dtype=torch.float64))
        @ rotation(2, phi).T
    )

    def a_matrix(t: float, f: float) -> np.ndarray:  # R_t^T diag(3, 2) R_f by hand
        ct, st, cf, sf = math.cos(t), math.sin(t), math.cos(f), math.sin(f)
        return np.array([[3 * ct * cf + 2 * st * sf, -3 * ct * sf + 2 * st * cf],
                         [-3 * st * cf + 2 * ct * sf, 3 * st * sf + 2 * ct * cf]])  # fmt: skip

    for variant, a in (("ujv", a_matrix(theta, phi)), ("vju", a_matrix(phi, theta))):
        authors = np.linalg.norm(np.abs(a) - np.diag([3.0, 2.0])) / math.sqrt(13)
        offdiag = math.sqrt(a[0, 1] ** 2 + a[1, 0] ** 2) / 5.0
        assert coupling.mis_coupling(jac_i, jac_j, 2, "authors", variant, "p") == pytest.approx(
            authors, rel=1e-10
        )
        assert coupling.mis_coupling(jac_i, jac_j, 2, "offdiag", variant, "trace") == pytest.approx(
            offdiag, rel=1e-10
        )


def test_maximum_is_reached_by_a_deranged_basis() -> None:
    """||A||_F <= ||S_{i,K}||_F for any K orthonormal columns (Ky Fan), so with p = 2 the offdiag
    reading is <= 1 and the authors reading <= sqrt(2). Both bounds are reached when J_j's left
    basis is J_i's with its top-K columns cyclically permuted: A = Pi^T S_i has a zero diagonal."""
    d, k = 8, 4
    gen = torch.Generator().manual_seed(7)
    u, v = random_orthogonal(d, gen), random_orthogonal(d, gen)
    s_i = torch.tensor([8.0, 6.0, 5.0, 4.0, 1.0, 0.5, 0.2, 0.1], dtype=torch.float64)
    jac_i = u @ torch.diag(s_i) @ v.T
    perm = list(range(1, k)) + [0] + list(range(k, d))
    jac_j = (
        u[:, perm]
        @ torch.diag(torch.tensor([9.0, 7.0, 6.5, 6.0, 0.4, 0.3, 0.2, 0.1], dtype=torch.float64))
        @ v.T
    )
    assert coupling.mis_coupling(jac_i, jac_j, k, reading="offdiag") == pytest.approx(
        1.0, rel=1e-10
    )
    assert coupling.mis_coupling(jac_i, jac_j, k, reading="authors") == pytest.approx(
        math.sqrt(2), rel=1e-10
    )


# --- independent random Jacobians -----------------------------------------------------------------


def expected_random(jac_i: torch.Tensor, k: int, reading: str) -> float:
    """E[m_K] for J_j independent of J_i with Haar singular bases (as for a Gaussian J_j): the
    entries of A are ~ N(0, sigma^2), sigma = ||J_i||_F / d, so
    offdiag: sqrt(K (K - 1)) sigma / ||S_K||;
    authors: sqrt(K^2 sigma^2 - 2 sqrt(2 / pi) sigma sum S_K + ||S_K||^2) / ||S_K||
             (approximately)."""
    d = jac_i.shape[0]
    s = svd(jac_i).s[:k].double().numpy()
    sigma = float(jac_i.double().norm()) / d
    norm = np.linalg.norm(s)
    if reading == "offdiag":
        return math.sqrt(k * (k - 1)) * sigma / norm
    return (
        math.sqrt(k**2 * sigma**2 - 2 * math.sqrt(2 / math.pi) * sigma * s.sum() + norm**2) / norm
    )


@pytest.mark.parametrize("reading", READINGS)
def test_independent_gaussian_pairs(reading: str) -> None:
    """d = 64, K = 10. Independent Gaussians sit at the expected value of unrelated bases (offdiag
    ~0.2, authors ~0.96: J_i's top-K spectrum is far above the ~N(0, 1) entries of A, so the
    offdiag reading stays well below its maximum 1; the authors one reaches ~0.68 of sqrt(2)), and
    far above a copy perturbed by 1% noise."""
    d, k = 64, 10
    values, expected, perturbed = [], [], []
    for seed in range(6):
        jac_i, jac_j = gaussian(d, 100 + seed), gaussian(d, 200 + seed)
        values.append(coupling.mis_coupling(jac_i, jac_j, k, reading=reading))
        expected.append(expected_random(jac_i, k, reading))
        near = jac_i + 0.01 * gaussian(d, 300 + seed)
        perturbed.append(coupling.mis_coupling(jac_i, near, k, reading=reading))
    assert np.mean(values) == pytest.approx(np.mean(expected), rel=0.1)
    bound = 1.0 if reading == "offdiag" else math.sqrt(2)
    assert max(values) < bound
    assert min(values) > 20 * max(perturbed)


# --- sufficient statistics ------------------------------------------------------------------------


def test_statistics_equal_direct_metric_for_every_option() -> None:
    """docs/datasets.md: m_K from (diag, corner) of the K_max x K_max matrix equals m_K computed
    directly, for every K <= K_max, reading, variant, norm and p (float32 Jacobians)."""
    gen = torch.Generator().manual_seed(8)
    d, k_max, m = 24, 12, 4
    base = torch.randn(d, d, generator=gen)
    jacs = torch.stack([base + 0.7 * torch.randn(d, d, generator=gen) for _ in range(m)]).float()
    top = svd(jacs).top(k_max)
    s = svd(jacs).s.double().numpy()  # (m, d)
    for variant in VARIANTS:
        diag, corner = coupling.cross_stats(jacs, *coupling.bases(top, variant))
        assert diag.shape == corner.shape == (m, m, k_max)
        diag, corner = diag.numpy(), corner.numpy()
        for reading, norm, k, p in itertools.product(READINGS, NORMS, (1, 3, 7, k_max), (2.0, 1.0)):
            if norm == "trace" and p != 2.0:
                continue
            from_stats = formulas.mis_coupling_from_stats(
                diag, corner, s[:, None, :], k, reading, norm, p
            )
            direct = np.array(
                [
                    [
                        coupling.mis_coupling(jacs[i], jacs[j], k, reading, variant, norm, p)
                        for j in range(m)
                    ]
                    for i in range(m)
                ]
            )
            np.testing.assert_allclose(
                from_stats,
                direct,
                rtol=0,
                atol=1e-5,
                err_msg=f"{variant} {reading} {norm} K={k} p={p}",
            )
            assert np.all(np.diag(from_stats) < 1e-5) if variant == "ujv" else True
            np.testing.assert_allclose(
                coupling.depth_mis_coupling(
                    jacs, k, reading=reading, variant=variant, norm=norm, p=p
                ),
                direct,
                atol=1e-6,  # float32 input, batched vs per-pair matmuls
            )


def test_corner_statistic_is_the_leading_block() -> None:
    a = torch.arange(16, dtype=torch.float64).reshape(4, 4) - 7.5
    diag, corner = coupling.matrix_stats(a)
    torch.testing.assert_close(diag, torch.diagonal(a))
    expected = torch.stack([a[:k, :k].square().sum() for k in range(1, 5)])
    torch.testing.assert_close(corner, expected)
    assert corner.dtype == torch.float64


# --- bad input ------------------------------------------------------------------------------------


def test_bad_input_is_refused_clearly() -> None:
    jac = gaussian(8, seed=9)
    with pytest.raises(ValueError, match=r"K=9 is outside 1..8"):
        coupling.mis_coupling(jac, jac, 9)
    with pytest.raises(ValueError, match=r"K=0 is outside"):
        coupling.mis_coupling(jac, jac, 0)
    with pytest.raises(ValueError, match=r"reading 'diag' is not one of authors, offdiag"):
        coupling.mis_coupling(jac, jac, 2, reading="diag")
    with pytest.raises(ValueError, match=r"variant 'uvj' is not one of ujv, vju"):
        coupling.mis_coupling(jac, jac, 2, variant="uvj")
    with pytest.raises(ValueError, match=r"norm 'fro' is not one of p, trace"):
        coupling.mis_coupling(jac, jac, 2, norm="fro")
    top = svd(jac[None]).top(4)
    diag, corner = (x.numpy() for x in coupling.cross_stats(jac[None], *coupling.bases(top, "ujv")))
    s = top.s.double().numpy()[:, None, :]
    with pytest.raises(ValueError, match=r"K=5 is outside 1..4 \(K_max"):
        formulas.mis_coupling_from_stats(diag, corner, s, 5)
    with pytest.raises(ValueError, match="reading 'x'"):
        formulas.mis_coupling_from_stats(diag, corner, s, 2, reading="x")
    with pytest.raises(ValueError, match="norm 'x'"):
        formulas.mis_coupling_from_stats(diag, corner, s, 2, norm="x")
    with pytest.raises(ValueError, match="exceeds the number of singular values"):
        svd(jac).top(9)


def test_spectrum_sums_without_singular_values_equal_the_svd() -> None:
    """The top-K path's ||J||_F^2 and ||J^T J||_F^2 against numpy's full spectrum."""
    jacs = torch.from_numpy(np.random.default_rng(3).normal(size=(4, 9, 9)))
    s = np.linalg.svd(jacs.numpy(), compute_uv=False)
    sum2, sum4 = coupling.spectrum_sums(jacs)
    np.testing.assert_allclose(sum2.numpy(), (s**2).sum(-1), rtol=1e-12)
    np.testing.assert_allclose(sum4.numpy(), (s**4).sum(-1), rtol=1e-12)
    from_s = coupling.spectrum_sums(jacs, torch.from_numpy(s))
    np.testing.assert_allclose(from_s[1].numpy(), (s**4).sum(-1), rtol=1e-12)


def test_metric_config_refuses_ks_the_extraction_cannot_serve() -> None:
    """The plan-time checks ask the MetricConfig itself: a K above extract.k_max, or one that
    extract.stored_ks leaves out, is a one-line error naming the key; every K stored passes."""
    from blockcoupling.coupling.metrics import MetricConfig

    config = MetricConfig(ks=(2, 10))
    config.check_extractable(10, [2, 10])
    config.check_extractable(10, None)  # all Ks up to k_max stored
    with pytest.raises(ValueError, match=r"metrics.ks has K=10 > extract.k_max=8; raise k_max"):
        config.check_extractable(8, None)
    with pytest.raises(ValueError, match=r"K=10, which extract.stored_ks=\[2, 4\] does not"):
        config.check_extractable(32, [2, 4])


def test_metric_config_names_the_ks_above_chance_per_model() -> None:
    """K/d above the limit, by hand: widths 64 and 512 at 1/8 (limits 8 and 64)."""
    from blockcoupling.coupling.metrics import MetricConfig

    config = MetricConfig(ks=(2, 10, 100))
    assert config.over_chance({"small": 64, "large": 512}, 1 / 8) == {
        10: ["small"],
        100: ["large", "small"],
    }
    assert config.over_chance({"large": 512}, 1 / 8) == {100: ["large"]}
