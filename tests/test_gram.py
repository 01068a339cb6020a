"""Top-K triplets from the Gram matrix, and the batched pair statistics, against independent
computations: the float64 dense SVD and the explicit K x K matrices ``A_ij`` of every pair.
"""

from __future__ import annotations

import pytest
import torch
from conftest import with_spectrum
from tiny_models import DEVICE

from blockcoupling.jacobians import gram
from blockcoupling.jacobians.gram import gram_top_k
from blockcoupling.jacobians.options import SVDOptions
from blockcoupling.jacobians.spectral import svd, top_k
from blockcoupling.jacobians.statistics import bases, pair_stats


def decaying(d: int, last: float) -> torch.Tensor:
    """Singular values from 1 down to ``last``, geometrically."""
    return torch.logspace(0, torch.log10(torch.tensor(last)).item(), d, dtype=torch.float64)


def aligned(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``got (..., d, k)`` with each column's sign flipped to match ``ref``'s."""
    return got * torch.sign((got * ref).sum(-2, keepdim=True))


def test_gram_top_k_matches_the_float64_svd_down_to_small_singular_values() -> None:
    # s_100 / s_1 from 1.5e-1 to 3e-3 (s_120 / s_1 = 1e-3): the squared condition up to 1e5
    jacs = torch.stack([with_spectrum(decaying(120, 10.0**-e), seed=e) for e in (1, 2, 3)])
    for dtype in (torch.float64, torch.float32):
        given = jacs.to(dtype)
        ref = svd(given.double()).top(100)  # the exact SVD of the same (rounded) matrices
        factors = gram_top_k(given.to(DEVICE), 100).factors
        assert factors.u.dtype == dtype and factors.u.shape == (3, 120, 100)
        u, s, v = (x.double().cpu() for x in factors)
        tol = 1e-10 if dtype == torch.float64 else 1e-6
        torch.testing.assert_close(s, ref.s, rtol=tol, atol=0)
        torch.testing.assert_close(aligned(u, ref.u), ref.u, rtol=0, atol=tol)
        torch.testing.assert_close(aligned(v, ref.v), ref.v, rtol=0, atol=tol)
        torch.testing.assert_close(given.double() @ v, u * s[:, None, :], rtol=0, atol=tol)
    full = torch.linalg.svdvals(jacs)  # every value, not the top K only
    got = gram_top_k(jacs.to(DEVICE), 100)
    torch.testing.assert_close(got.sum2.cpu(), full.square().sum(-1), rtol=1e-13, atol=0)
    torch.testing.assert_close(got.sum4.cpu(), full.pow(4).sum(-1), rtol=1e-13, atol=0)


def test_a_tiny_s_k_takes_the_dense_svd(monkeypatch: pytest.MonkeyPatch) -> None:
    """At s_k / s_1 = 1e-7 the Gram matrix's eigenvalue lambda_k = 1e-14 lambda_1 sits at its
    rounding error: the Gram path alone gets s_k wrong, the floor sends it to the dense SVD."""
    s = decaying(60, 1e-7)
    jacs = torch.stack([with_spectrum(s, seed=1), with_spectrum(decaying(60, 0.5), seed=2)])
    ref = svd(jacs).top(59)
    monkeypatch.setattr(gram, "FLOOR", 0.0)
    unguarded = gram_top_k(jacs, 59).factors
    assert ((unguarded.s[0] - ref.s[0]) / ref.s[0]).abs().max() > 1e-4
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(gram, "svd", lambda jac: calls.append(jac.shape) or svd(jac))
    got = gram_top_k(jacs, 59).factors
    assert calls == [(1, 60, 60)]  # the ill-conditioned matrix only
    torch.testing.assert_close(got.s, ref.s, rtol=1e-10, atol=0)
    torch.testing.assert_close(aligned(got.u, ref.u), ref.u, rtol=0, atol=1e-8)


def test_auto_takes_the_gram_path_up_to_dense_up_to() -> None:
    options = SVDOptions()
    assert [options.resolve(d, 50) for d in (576, 1024, 2048)] == ["gram", "gram", "topk"]
    assert SVDOptions(dense_up_to=0).resolve(60, 50) == "gram"  # a sketch as wide as d
    assert SVDOptions(method="dense").resolve(4096, 50) == "dense"
    assert SVDOptions(method="gram").resolve(4096, 50) == "gram"
    assert SVDOptions(method="topk").resolve(60, 50) == "dense"
    jac = with_spectrum(decaying(80, 1e-2), seed=4).float()
    via = top_k(jac, 10, SVDOptions(method="gram"))
    assert torch.equal(via.s, gram_top_k(jac, 10).factors.s)


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 30])  # one Jacobian per chunk; all at once
def test_pair_stats_equal_the_explicit_matrices_of_every_pair(chunk_bytes: int) -> None:
    gen = torch.Generator().manual_seed(0)
    jacs = torch.randn(5, 40, 40, generator=gen, dtype=torch.float64).to(DEVICE)
    refs = svd(torch.randn(3, 40, 40, generator=gen, dtype=torch.float64).to(DEVICE)).top(6)
    variants = ("vju", "ujv")
    diag, corner = pair_stats(jacs, refs, variants, chunk_bytes)
    assert diag.shape == corner.shape == (2, 5, 3, 6)
    for v, variant in enumerate(variants):
        left, right = bases(refs, variant)
        for i in range(5):
            for j in range(3):
                a = (left[j].mT @ jacs[i] @ right[j]).cpu()  # A_ij, explicitly
                torch.testing.assert_close(diag[v, i, j].cpu(), torch.diagonal(a))
                expected = torch.stack([a[:k, :k].square().sum() for k in range(1, 7)])
                torch.testing.assert_close(corner[v, i, j].cpu(), expected)


def test_the_eigensolver_off_cpu_gives_the_lapack_top_eigenpairs() -> None:
    """``top_eigh_torch`` (every eigenpair, the CUDA path) against the CPU's index-range LAPACK."""
    jacs = torch.stack([with_spectrum(decaying(50, 1e-2), seed=s) for s in (7, 8)])
    gram_matrix = jacs.mT @ jacs
    values, vectors = gram.top_eigh_torch(gram_matrix.to(DEVICE), 12)
    ref_values, ref_vectors = gram._top_eigh(gram_matrix, 12)
    torch.testing.assert_close(values.cpu(), ref_values, rtol=1e-12, atol=0)
    torch.testing.assert_close(aligned(vectors.cpu(), ref_vectors), ref_vectors, rtol=0, atol=1e-10)
    assert (values[:, :-1] > values[:, 1:]).all()
