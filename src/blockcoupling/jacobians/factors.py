"""Singular triplets of stacked Jacobians: the ``SVD`` record and the dense SVD (shared by the
top-K methods of ``spectral`` and ``gram``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["SVD", "svd"]


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
