"""Singular value decompositions of Jacobians: dense, or the top K by randomized subspace iteration.

The coupling statistics need only the top ``K_max`` triplets of every Jacobian (and their
singular values for the normaliser of ``S_K``). At paper widths a dense SVD is O(d^3) and
dominates the cost (d = 4096: 13.5 s on one CPU thread, against 2.5 s for the top 50 here;
bench/runs/depth_speed_quiet.md); the top-K path (randomized block Krylov) costs
O(d^2 (K + p) i) with ``p`` oversampling columns and ``i`` iterations, stopping early once the
top-K singular values change by less than ``tol`` (relative) between iterations, and falling
back to a dense SVD of the matrices that have not settled by ``iters``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from blockcoupling.jacobians.options import SVDOptions

__all__ = ["SVD", "SVDOptions", "randomized_top_k", "singular_values", "svd", "top_k"]


class SVD(NamedTuple):
    """``J = U diag(S) V^T``: ``u (..., d, r)``, ``s (..., r)`` descending, ``v (..., d, r)``."""

    u: torch.Tensor
    s: torch.Tensor
    v: torch.Tensor

    def top(self, k: int) -> SVD:
        """The top-k triplets."""
        if k > self.s.shape[-1]:
            raise ValueError(f"K={k} exceeds the number of singular values {self.s.shape[-1]} (d)")
        return SVD(self.u[..., :k], self.s[..., :k], self.v[..., :k])

    def pick(self, index: int) -> SVD:
        """The triplets of one matrix of a stack."""
        return SVD(self.u[index], self.s[index], self.v[index])


def svd(jac: torch.Tensor) -> SVD:
    """Full thin SVD of ``(..., d, d)`` Jacobians."""
    u, s, vh = torch.linalg.svd(jac, full_matrices=False)
    return SVD(u, s, vh.mT)


def top_k(jac: torch.Tensor, k: int, options: SVDOptions = SVDOptions()) -> SVD:
    """The top-``k`` singular triplets of ``(..., m, n)`` matrices, dense or randomized as
    ``options`` says; ``u (..., m, k)``, ``s (..., k)`` descending, ``v (..., n, k)``.
    """
    if k > min(jac.shape[-2:]):
        raise ValueError(f"K={k} exceeds the number of singular values {min(jac.shape[-2:])} (d)")
    if options.uses_dense(min(jac.shape[-2:]), k):
        return svd(jac).top(k)
    return randomized_top_k(jac, k, options)


def _orthonormal(y: torch.Tensor) -> torch.Tensor:
    return torch.linalg.qr(y).Q


def randomized_top_k(jac: torch.Tensor, k: int, options: SVDOptions) -> SVD:
    """Top-``k`` triplets by randomized block Krylov iteration (Musco & Musco 2015): a seeded
    Gaussian sketch of ``k + oversample`` columns, then one more block ``(J J^T)^i J sketch`` per
    iteration (each block orthonormalised, then the whole space), and the SVD of ``J`` projected
    on that space. It stops once every top-``k`` singular value moves by less than ``tol`` of
    itself; matrices that have not settled after ``iters`` iterations get a dense SVD.
    """
    m, n = jac.shape[-2:]
    width = min(k + options.oversample, m, n)
    generator = torch.Generator(device=jac.device).manual_seed(options.seed)
    sketch = torch.randn(n, width, generator=generator, device=jac.device, dtype=jac.dtype)
    blocks = [_orthonormal(jac @ sketch)]  # (..., m, width) each
    values = _top_values(blocks[0].mT @ jac, k)
    for _ in range(options.iters):
        if width * (len(blocks) + 1) >= m:  # the space would be all of R^m: exact is cheaper
            break
        blocks.append(_orthonormal(jac @ (jac.mT @ blocks[-1])))
        basis = _orthonormal(torch.cat(blocks, -1))
        projection = basis.mT @ jac  # (..., w, n)
        previous, values = values, _top_values(projection, k)
        settled = _settled(values, previous, options.tol)
        if settled.all():
            return _factors(basis, projection, k)
    else:
        factors = _factors(basis, projection, k)
        unsettled = ~settled  # a flat spectrum around the K-th value: exact for those matrices
        exact = svd(jac[unsettled]).top(k)
        for part, dense in zip(factors, exact):
            part[unsettled] = dense
        return factors
    return svd(jac).top(k)


def _top_values(projection: torch.Tensor, k: int) -> torch.Tensor:
    """The top-k singular values ``(..., k)`` of ``projection = basis^T J (..., w, n)``, from the
    eigenvalues of its ``w x w`` Gram matrix in float64: for the convergence test, far cheaper
    than an SVD of the projection.
    """
    b = projection.to(torch.float64)
    gram = b @ b.mT
    top = torch.linalg.eigvalsh(gram).flip(-1)[..., :k].clamp_min(0)
    return top.rsqrt().reciprocal().to(projection.dtype)  # sqrt: isa.VENDOR_DEPENDENT_OPS


def _factors(basis: torch.Tensor, projection: torch.Tensor, k: int) -> SVD:
    """Top-k triplets of ``J`` restricted to the range of ``basis (..., m, w)``, from
    ``projection = basis^T J (..., w, n)``.
    """
    small_u, s, small_vh = torch.linalg.svd(projection, full_matrices=False)
    return SVD((basis @ small_u)[..., :k], s[..., :k], small_vh.mT[..., :k])


def _settled(s: torch.Tensor, previous: torch.Tensor, tol: float) -> torch.Tensor:
    """Per matrix, whether each top-K singular value moved by less than ``tol`` of itself
    (values below 1e-6 of the largest count as settled when they move less than that).
    """
    floor = 1e-6 * s[..., :1].clamp_min(torch.finfo(s.dtype).tiny)
    return ((s - previous).abs() <= tol * torch.maximum(s, floor)).all(dim=-1)


def singular_values(jac: torch.Tensor) -> torch.Tensor:
    """Every singular value of ``(..., d, d)`` matrices, descending (no vectors: ~4x cheaper)."""
    return torch.linalg.svdvals(jac)
