"""Top-K triplets from the Gram matrix, and the batched pair statistics, against independent
computations: the float64 dense SVD and the explicit K x K matrices ``A_ij`` of every pair.
"""

from __future__ import annotations

import pytest
import torch
from conftest import with_spectrum
from tiny_models import DEVICE
from torch.utils._python_dispatch import TorchDispatchMode

from blockcoupling.jacobians import gram
from blockcoupling.jacobians.gram import gram_top_k
from blockcoupling.jacobians.options import SVDOptions
from blockcoupling.jacobians.spectral import svd, top_k
from blockcoupling.jacobians.statistics import bases, basis_corners, matrix_stats, pair_stats


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


@pytest.mark.parametrize("same", [True, False])
def test_basis_corners_equal_the_explicit_products_of_every_pair(same: bool) -> None:
    """Against ``B_i^T B'_j`` of every ordered pair, explicitly; the bases against themselves
    (each unordered pair computed once) give the explicit corners of both orders.
    """
    gen = torch.Generator().manual_seed(1)
    basis = svd(torch.randn(4, 30, 30, generator=gen, dtype=torch.float64)).top(5).u
    ref = (
        basis if same else svd(torch.randn(3, 30, 30, generator=gen, dtype=torch.float64)).top(5).v
    )
    corners = basis_corners(basis) if same else basis_corners(basis, ref)
    assert corners.shape == (4, len(ref), 5)
    for i in range(4):
        for j in range(len(ref)):
            cross = basis[i].mT @ ref[j]
            expected = torch.stack([cross[:k, :k].square().sum() for k in range(1, 6)])
            torch.testing.assert_close(corners[i, j], expected, rtol=1e-12, atol=1e-14)


class MatmulOps(TorchDispatchMode):
    """The matrix-product overloads called under it (``aten.bmm.out``, ``aten.mm.default``...)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = str(func)
        if any(part in name.split(".")[1] for part in ("mm", "matmul", "baddbmm", "dot")):
            self.seen.add(name)
        return func(*args, **(kwargs or {}))


def test_pair_statistics_call_only_the_routed_products() -> None:
    """A pinned job routes ``mm``, ``bmm`` and ``addmm`` to OpenBLAS (``runtime.blas``); their
    ``out=`` forms are other ops, which stay on ATen's kernels (the pair statistics' 1,800
    small products ran there at a fifth of the rate).
    """
    gen = torch.Generator().manual_seed(2)
    jacs = torch.randn(3, 24, 24, generator=gen)
    refs = svd(jacs).top(4)
    with MatmulOps() as ops:
        pair_stats(jacs, refs, ("ujv", "vju"))
        basis_corners(refs.u)
        basis_corners(refs.u, refs.v)
    assert ops.seen  # the products were seen
    assert ops.seen <= {"aten.mm.default", "aten.bmm.default", "aten.addmm.default"}, ops.seen


def old_pair_stats(jacs: torch.Tensor, factors, variants) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair statistics as computed before the plain ``bmm`` (its ``out=`` form), one
    chunk."""
    pairs = [bases(factors, variant) for variant in variants]
    left, right = torch.stack([p for p, _ in pairs]), torch.stack([q for _, q in pairs])
    n_var, n_ref, d, k = right.shape
    columns = right.permute(2, 0, 1, 3).reshape(d, n_var * n_ref * k)
    rows = left.mT.reshape(n_var * n_ref, k, d)
    m = jacs.shape[0]
    a = jacs.new_empty(m, n_var * n_ref, k, k)
    x = (jacs.reshape(-1, d) @ columns).view(m, d, n_var * n_ref, k)
    for i in range(m):
        torch.bmm(rows, x[i].permute(1, 0, 2), out=a[i])
    return matrix_stats(a.view(m, n_var, n_ref, k, k).transpose(0, 1))


def test_float32_pair_statistics_agree_with_the_previous_products() -> None:
    """float32 at a block's shape (d = 192, K = 16): the routed products against the previous
    code's (ATen's ``bmm.out``) and its basis corners (one ``einsum`` of every ordered pair),
    within 1e-6 of each statistic's scale.
    """
    gen = torch.Generator().manual_seed(3)
    jacs = torch.randn(6, 192, 192, generator=gen) / 14
    refs = svd(jacs).top(16)
    for new, old in (
        (pair_stats(jacs, refs, ("ujv", "vju")), old_pair_stats(jacs, refs, ("ujv", "vju"))),
        (
            (basis_corners(refs.v),),
            (matrix_stats(torch.einsum("idk,jdl->ijkl", refs.v, refs.v))[1],),
        ),
    ):
        for got, expected in zip(new, old):
            scale = expected.abs().max()
            assert (got - expected).abs().max() <= 1e-6 * scale


def test_the_eigensolver_off_cpu_gives_the_lapack_top_eigenpairs() -> None:
    """``top_eigh_torch`` (every eigenpair, the CUDA path) against the CPU's index-range LAPACK."""
    jacs = torch.stack([with_spectrum(decaying(50, 1e-2), seed=s) for s in (7, 8)])
    gram_matrix = jacs.mT @ jacs
    values, vectors = gram.top_eigh_torch(gram_matrix.to(DEVICE), 12)
    ref_values, ref_vectors = gram._top_eigh(gram_matrix, 12)
    torch.testing.assert_close(values.cpu(), ref_values, rtol=1e-12, atol=0)
    torch.testing.assert_close(aligned(vectors.cpu(), ref_vectors), ref_vectors, rtol=0, atol=1e-10)
    assert (values[:, :-1] > values[:, 1:]).all()
