"""The coupling metric m_K on Jacobians (torch): the exact sufficient statistics, and m_K computed
directly from two Jacobians (notebooks, tests). The numpy formulas that turn statistics into m_K
live in ``coupling.formulas``.

``A_ij = P_j^T J_i Q_j`` with ``(P, Q) = (U, V)`` ("ujv", default) or ``(V, U)`` ("vju"), top K.
Extraction stores, per pair, ``diag[a] = A[a, a]`` and ``corner[k-1] = sum_{a,b<k} A[a, b]^2`` of
the K_max x K_max matrix; since ``A[:K, :K]`` is exactly the matrix of m_K, every K <= K_max,
reading, p and normalisation follows with no Jacobian (``formulas.mis_coupling_from_stats``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from blockcoupling.coupling.formulas import READINGS, VARIANTS, check_option, normaliser
from blockcoupling.jacobians.spectral import SVD, svd


def bases(factors: SVD, variant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Left and right bases ``(P, Q)``, each ``(..., d, K)``, of a variant."""
    check_option("variant", variant, VARIANTS)
    return (factors.u, factors.v) if variant == "ujv" else (factors.v, factors.u)


def cross_stats(
    jacs: torch.Tensor, left: torch.Tensor, right: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Statistics of every ``J_i`` seen in every reference basis ``j``.

    ``jacs (m, d, d)``; ``left, right (m', d, K)``. Returns ``diag (m, m', K)`` and
    ``corner (m, m', K)`` of ``A_ij = left_j^T J_i right_j``. Loops over references to bound
    memory at ``m * K * d`` floats.
    """
    diags, corners = [], []
    for j in range(left.shape[0]):
        a = torch.matmul(left[j].mT, torch.matmul(jacs, right[j]))  # (m, K, K)
        d, c = matrix_stats(a)
        diags.append(d)
        corners.append(c)
    return torch.stack(diags, dim=1), torch.stack(corners, dim=1)


STATS_CHUNK_BYTES = 256 << 20  # the products of one chunk of Jacobians in ``pair_stats``


def pair_stats(
    jacs: torch.Tensor, factors: SVD, variants: Sequence[str], chunk_bytes: int = STATS_CHUNK_BYTES
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cross_stats`` of every pair and variant at once, as a few large products.

    ``jacs (m, d, d)``; ``factors`` top-K of ``m'`` references (``u, v (m', d, K)``). Returns
    ``diag (variant, m, m', K)`` and ``corner (variant, m, m', K)`` of
    ``A_ij = P_j^T J_i Q_j`` (float64). Per chunk of ``c`` Jacobians: one product of the stacked
    chunk with every right basis of every variant side by side, ``(c d, d) x (d, variant m' K)``
    (the shape BLAS runs fastest: twice the rate of the transposed one here), then per Jacobian
    one batched product ``P_j^T (J_i Q_j)`` over variants and references, reading ``J_i Q_j``
    in place (a strided view, no copy). Plain ``mm``/``bmm`` calls only, never their ``out=``
    forms, which the matmul route of a pinned job (``runtime.blas``) does not cover (there
    they ran at a fifth of the rate). The chunk's ``J_i Q_j`` stay under ``chunk_bytes`` (at
    least one Jacobian per chunk).
    """
    pairs = [bases(factors, variant) for variant in variants]
    left = torch.stack([p for p, _ in pairs])  # (V, m', d, K)
    right = torch.stack([q for _, q in pairs])
    n_var, n_ref, d, k = right.shape
    groups = n_var * n_ref
    columns = right.permute(2, 0, 1, 3).reshape(d, groups * k)  # (d, V m' K): every Q_j
    rows = left.mT.reshape(groups, k, d)  # every P_j^T
    step = max(1, chunk_bytes // (d * groups * k * jacs.element_size()))
    m = jacs.shape[0]
    a = jacs.new_empty(m, groups, k, k)
    for start in range(0, m, step):
        chunk = jacs[start : start + step]
        x = (chunk.reshape(-1, d) @ columns).view(chunk.shape[0], d, groups, k)  # J_i Q_j
        for i in range(chunk.shape[0]):
            a[start + i] = torch.bmm(rows, x[i].permute(1, 0, 2))  # P_j^T J_i Q_j
    return matrix_stats(a.view(m, n_var, n_ref, k, k).transpose(0, 1))


def basis_corners(basis: torch.Tensor, basis_ref: torch.Tensor | None = None) -> torch.Tensor:
    """Cumulative corner sums of squares ``(m, m', K)`` of ``B_i^T B'_j`` for bases
    ``basis (m, d, K)`` and ``basis_ref (m', d, K)`` (e.g. U_i and U_j): entry ``k-1`` is
    ``||B_{i,k}^T B'_{j,k}||_F^2``, the subspace overlap of the top-k spaces times k. float64.

    Without ``basis_ref``, the bases against themselves: ``B_j^T B_i = (B_i^T B_j)^T`` has the
    same corners, so the product is the symmetric ``X^T X`` of the side-by-side bases ``X (d,
    m K)``, each unordered pair once (numpy's ``syrk`` where the matmuls are routed).
    """
    m, d, k = basis.shape
    side = basis.permute(1, 0, 2).reshape(d, m * k)  # (d, m K): every B_i side by side
    if basis_ref is None:
        cross = side.mT @ side
    else:
        cross = side.mT @ basis_ref.permute(1, 0, 2).reshape(d, -1)
    return matrix_stats(cross.view(m, k, -1, k).transpose(1, 2))[1]


def spectrum_sums(jacs: torch.Tensor, s: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """``sum s^2`` and ``sum s^4`` over the FULL spectrum of each ``jacs (..., d, d)``, float64.

    From the singular values ``s (..., d)`` when given (a dense SVD has them for free); else
    ``||J||_F^2`` (d^2 flops) and ``||J^T J||_F^2`` (one d x d x d matmul, 2 d^3 flops, about
    what a top-K randomized SVD already costs per Jacobian).
    """
    if s is not None:
        s2 = s.to(torch.float64).square()
        return s2.sum(-1), s2.square().sum(-1)
    gram = (jacs.mT @ jacs).to(torch.float64)
    return jacs.to(torch.float64).square().sum((-2, -1)), gram.square().sum((-2, -1))


def matrix_stats(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``diag (..., K)`` and cumulative corner sums of squares ``corner (..., K)`` of
    ``a (..., K, K)``, in float64: m_K is the square root of a difference of these sums, so near
    m = 0 their rounding error is amplified (float64 keeps it near 1e-8).
    """
    a = a.to(torch.float64)
    cumulative = torch.cumsum(torch.cumsum(a.square(), dim=-1), dim=-2)
    return torch.diagonal(a, dim1=-2, dim2=-1), torch.diagonal(cumulative, dim1=-2, dim2=-1)


def coupling_matrix_direct(a: torch.Tensor, s_i: torch.Tensor, reading: str) -> torch.Tensor:
    """The numerator ``|| |A| - S ||_F`` or ``|| A - diag(A) ||_F`` from an explicit
    ``a (K, K)``.
    """
    check_option("reading", reading, READINGS)
    if reading == "authors":
        return torch.linalg.matrix_norm(a.abs() - torch.diag(s_i))
    return torch.linalg.matrix_norm(a - torch.diag(torch.diagonal(a)))


def mis_coupling(
    jac_i: torch.Tensor,
    jac_j: torch.Tensor,
    k: int,
    reading: str = "authors",
    variant: str = "ujv",
    norm: str = "p",
    p: float = 2.0,
) -> float:
    """m_K(J_i, J_j) computed directly from two ``(d, d)`` Jacobians (notebooks, tests)."""
    d = jac_i.shape[-1]
    if not 1 <= k <= d:
        raise ValueError(f"K={k} is outside 1..{d} (d)")
    factors_i, factors_j = svd(jac_i).top(k), svd(jac_j).top(k)
    left, right = bases(factors_j, variant)
    a = left.mT @ jac_i @ right
    numerator = coupling_matrix_direct(a, factors_i.s, reading)
    return float(numerator) / float(normaliser(factors_i.s.detach().cpu().numpy(), k, norm, p))


def depth_mis_coupling(
    jacs: torch.Tensor,
    k: int,
    reading: str = "authors",
    variant: str = "ujv",
    norm: str = "p",
    p: float = 2.0,
) -> np.ndarray:
    """``(layer, layer_ref)`` matrix of m_K over a stack of Jacobians ``(layer, d, d)``, from the
    explicit K x K matrices (one SVD per Jacobian; independent of the statistics path).
    """
    factors = svd(jacs).top(k)
    left, right = bases(factors, variant)
    s = factors.s.detach().cpu().numpy()
    n = jacs.shape[0]
    out = np.empty((n, n))
    for j in range(n):
        a = left[j].mT @ jacs @ right[j]  # (layer, K, K): every J_i in J_j's basis
        for i in range(n):
            out[i, j] = float(coupling_matrix_direct(a[i], factors.s[i], reading)) / float(
                normaliser(s[i], k, norm, p)
            )
    return out
