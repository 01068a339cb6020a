"""Top-K singular triplets from the eigendecomposition of the Gram matrix ``J^T J`` in float64.

The tridiagonal reduction of a symmetric matrix costs less than the bidiagonal one of an SVD,
and only the top ``k`` eigenvectors need back-transforming: on CPU LAPACK's ``dsyevr`` with an
index range (scipy), elsewhere ``torch.linalg.eigh`` of the whole batch. The right vectors are
the eigenvectors ``V``, the values ``s = sqrt(lambda)``, the left vectors ``U = J V / s``.

Squaring squares the condition number, hence float64: an eigenvalue's absolute error is about
``eps64 * s_1^2``, so ``s_k`` has relative error ``~ eps64 (s_1 / s_k)^2 / 2`` (2e-8 at
``s_k = 1e-4 s_1``), below the float32 dense SVD's ``~ eps32 s_1 / s_k`` (6e-4 there) for any
``s_k / s_1 > 2 eps64 / eps32 ~ 4e-9``; ``U``'s columns are orthonormal to ``~ eps64 s_1^2 /
(s_a s_b)``. Matrices whose ``s_k`` lies below ``FLOOR`` times ``s_1`` take the dense float64
SVD instead. ``sum s^2`` and ``sum s^4`` over the FULL spectrum come from the Gram matrix's trace
and squared Frobenius norm.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.linalg
import torch

from blockcoupling.jacobians.factors import SVD, svd

__all__ = ["FLOOR", "GramTopK", "gram_sums", "gram_top_k"]

FLOOR = 1e-4  # s_k / s_1 below which a matrix takes the dense SVD (see the module docstring)


class GramTopK(NamedTuple):
    """Top-k ``factors`` (in the Jacobians' dtype) and the full spectrum's ``sum2 (...)`` =
    ``sum s^2`` and ``sum4 (...)`` = ``sum s^4`` (float64).
    """

    factors: SVD
    sum2: torch.Tensor
    sum4: torch.Tensor


def gram_sums(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum s^2 = trace(G)`` and ``sum s^4 = ||G||_F^2`` of ``gram = J^T J (..., n, n)``."""
    return torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1), gram.square().sum((-2, -1))


def gram_top_k(jac: torch.Tensor, k: int) -> GramTopK:
    """Top-``k`` triplets of ``jac (..., m, n)`` (``u (..., m, k)``, ``s (..., k)`` descending,
    ``v (..., n, k)``) from the float64 Gram matrix; see the module docstring.
    """
    *batch, m, n = jac.shape
    if k > min(m, n):
        raise ValueError(f"K={k} exceeds the number of singular values {min(m, n)} (d)")
    wide = jac.reshape(-1, m, n).to(torch.float64)
    gram = wide.mT @ wide  # (B, n, n)
    sum2, sum4 = gram_sums(gram)
    values, v = _top_eigh(gram, k)
    values = values.clamp_min(0)
    s = values.rsqrt().reciprocal()  # sqrt without aten::sqrt (isa.VENDOR_DEPENDENT_OPS)
    u = (wide @ v) * values.rsqrt()[:, None, :]
    low = (s[:, -1] <= FLOOR * s[:, 0]).nonzero().flatten().tolist()
    if low:
        exact = svd(wide[low]).top(k)
        u[low], s[low], v[low] = exact
    factors = SVD(
        u.to(jac.dtype).reshape(*batch, m, k),
        s.to(jac.dtype).reshape(*batch, k),
        v.to(jac.dtype).reshape(*batch, n, k),
    )
    return GramTopK(factors, sum2.reshape(batch), sum4.reshape(batch))


def _top_eigh(gram: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k eigenvalues ``(B, k)`` (descending) and eigenvectors ``(B, n, k)`` of symmetric
    ``gram (B, n, n)``: LAPACK ``dsyevr`` over an index range on CPU, ``torch.linalg.eigh``
    elsewhere.
    """
    if gram.device.type != "cpu":
        return top_eigh_torch(gram, k)
    n = gram.shape[-1]
    values = np.empty((gram.shape[0], k))
    vectors = np.empty((gram.shape[0], n, k))
    for i, matrix in enumerate(gram.numpy()):
        values[i], vectors[i] = scipy.linalg.eigh(
            matrix, subset_by_index=(n - k, n - 1), driver="evr", check_finite=False
        )
    return torch.from_numpy(values[:, ::-1].copy()), torch.from_numpy(vectors[:, :, ::-1].copy())


def top_eigh_torch(gram: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``_top_eigh`` by ``torch.linalg.eigh`` of the whole batch (every eigenpair), on any
    device: the path off CPU.
    """
    n = gram.shape[-1]
    values, vectors = torch.linalg.eigh(gram)
    return values[:, n - k :].flip(-1), vectors[:, :, n - k :].flip(-1)
