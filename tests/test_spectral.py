"""Top-K singular triplets (randomized block Krylov) against the dense SVD."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from conftest import with_spectrum
from torch.overrides import TorchFunctionMode

from blockcoupling.coupling.formulas import mis_coupling_from_stats
from blockcoupling.jacobians import spectral
from blockcoupling.jacobians.options import SVDOptions
from blockcoupling.jacobians.spectral import randomized_top_k, svd, top_k
from blockcoupling.jacobians.statistics import bases, cross_stats

TOPK = SVDOptions(method="topk", dense_up_to=0)


def flat_spectrum(d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Slowly decaying singular values 1/sqrt(1+i): s_50/s_70 is only 1.18."""
    return 1.0 / torch.sqrt(1.0 + torch.arange(d, dtype=dtype))


def no_dense_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(jac: torch.Tensor) -> None:
        raise AssertionError("fell back to the dense SVD")

    monkeypatch.setattr("blockcoupling.jacobians.spectral.svd", refuse)


def test_top_k_matches_the_dense_svd_on_a_slowly_decaying_spectrum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d, k = 400, 30
    jac = with_spectrum(flat_spectrum(d), seed=0)
    with monkeypatch.context() as patch:
        no_dense_fallback(patch)
        got = randomized_top_k(jac, k, TOPK)
    exact = svd(jac).top(k)
    assert float(((got.s - exact.s).abs() / exact.s).max()) < 1e-4
    # singular vectors up to sign: |<u_got, u_exact>| = 1
    overlap_u = (got.u * exact.u).sum(0).abs()
    overlap_v = (got.v * exact.v).sum(0).abs()
    assert float((1 - overlap_u).max()) < 1e-3 and float((1 - overlap_v).max()) < 1e-3
    torch.testing.assert_close(got.u * got.s @ got.v.T, exact.u * exact.s @ exact.v.T)


def test_top_k_coupling_statistics_match_dense_within_1e_3(monkeypatch: pytest.MonkeyPatch) -> None:
    """m_K of every pair of a stack (authors and offdiag readings, K = 10 and 30) from top-K
    factors is within 1e-3 of the dense path."""
    d, k_max = 600, 30
    base = with_spectrum(flat_spectrum(d), seed=1)
    gen = torch.Generator().manual_seed(2)
    jacs = torch.stack([base + 0.3 * torch.randn(d, d, generator=gen) / d**0.5 for _ in range(3)])
    with monkeypatch.context() as patch:
        no_dense_fallback(patch)
        fast = top_k(jacs, k_max, TOPK)
    values = {}
    for name, factors in (("topk", fast), ("dense", svd(jacs).top(k_max))):
        diag, corner = cross_stats(jacs, *bases(factors, "ujv"))
        s = factors.s.numpy()[:, None, :]
        values[name] = np.stack(
            [
                mis_coupling_from_stats(diag.numpy(), corner.numpy(), s, k, reading)
                for k in (10, 30)
                for reading in ("authors", "offdiag")
            ]
        )
    assert np.abs(values["topk"] - values["dense"]).max() < 1e-3


def test_unsettled_matrices_fall_back_to_the_dense_svd() -> None:
    """With one iteration a flat spectrum cannot settle: the result is then the dense one."""
    jacs = torch.stack([with_spectrum(flat_spectrum(200), seed) for seed in (3, 4)])
    got = randomized_top_k(jacs, 20, SVDOptions(method="topk", iters=1, tol=1e-12, oversample=5))
    torch.testing.assert_close(got.s, svd(jacs).top(20).s)


def test_top_k_is_seeded_and_the_methods_choose_as_documented() -> None:
    jac = with_spectrum(flat_spectrum(200, torch.float32), seed=5)
    first, again = (randomized_top_k(jac, 10, TOPK) for _ in range(2))
    assert torch.equal(first.u, again.u) and torch.equal(first.s, again.s)
    assert SVDOptions().uses_dense(576, 50) and not SVDOptions().uses_dense(4096, 50)
    assert SVDOptions(method="topk").uses_dense(60, 50)  # a sketch as wide as d saves nothing
    assert not SVDOptions(method="topk").uses_dense(576, 50)
    with pytest.raises(ValueError, match="extract.svd.method 'fast' is not one of"):
        SVDOptions(method="fast")
    with pytest.raises(ValueError, match="exceeds the number of singular values"):
        top_k(jac, 201)


class HostReads(TorchFunctionMode):
    """Counts the tensor methods that copy a value to the host (a GPU synchronization)."""

    READS = ("item", "tolist", "__bool__", "cpu", "numpy", "__float__", "__int__")

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if getattr(func, "__name__", "") in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_a_flat_spectrum_is_predicted_dense_at_its_first_check() -> None:
    """Gaussian matrices (flat around the K-th value, as a random-init block's) need ~9
    iterations: with ``iters`` 4 they take the dense SVD after two, read once on the host."""
    gen = torch.Generator().manual_seed(7)
    jacs = torch.randn(2, 1024, 1024, generator=gen) / 1024**0.5
    counts: Counter[str] = Counter()
    blocks = Counter()
    original = spectral._orthonormal

    def counted(y: torch.Tensor) -> torch.Tensor:
        blocks[y.shape[-1]] += 1
        return original(y)

    reads = HostReads()
    with pytest.MonkeyPatch.context() as patch, reads:
        patch.setattr(spectral, "_orthonormal", counted)
        got = randomized_top_k(jacs, 50, SVDOptions(method="topk", iters=4), counts)
    assert counts == Counter({"predicted dense": 2})
    assert reads.count == 1 and sum(blocks.values()) == 5  # the sketch, 2 blocks and 2 bases
    torch.testing.assert_close(got.s, svd(jacs).top(50).s)


def test_settling_reads_the_host_at_its_checks_not_every_iteration() -> None:
    """A slowly decaying spectrum that needs ~6 iterations settles with a host read at
    iterations 2, 4 and 6 only, and agrees with the dense SVD."""
    jacs = torch.stack([with_spectrum(1.0 / (1.0 + torch.arange(600.0)) ** 0.3, s) for s in (8, 9)])
    for iters, most_reads in ((8, 4), (16, 8)):
        counts: Counter[str] = Counter()
        reads = HostReads()
        with reads:
            got = randomized_top_k(jacs.float(), 30, SVDOptions(method="topk", iters=iters), counts)
        assert counts == Counter({"settled": 2})
        assert 1 <= reads.count <= min(most_reads, 3)  # iterations-independent: 2, 4, 6
        exact = svd(jacs).top(30)
        assert float(((got.s.double() - exact.s).abs() / exact.s).max()) < 1e-4
