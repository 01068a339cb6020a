"""The coupling metric's numpy formulas (science.md): m_K from exact sufficient statistics.

Torch-free, so the analysis rules (metrics, combine, stats, figures) need no torch. The Jacobian
side (``jacobians.statistics``) computes the statistics these formulas read:
``diag[a] = A[a, a]`` and ``corner[k-1] = sum_{a,b<k} A[a, b]^2`` of ``A_ij = P_j^T J_i Q_j``.
- reading "authors" (default): ``m_K = || |A_ij| - S_{i,K} ||_F / norm(S_{i,K})``
- reading "offdiag" (paper eq. 13-14): ``m_K = || A_ij - diag(A_ij) ||_F / norm(S_{i,K})``
with norm ``||S_{i,K}||_p`` ("p") or ``trace(S_{i,K})`` ("trace").
"""

from __future__ import annotations

import numpy as np

READINGS = ("authors", "offdiag")
VARIANTS = ("ujv", "vju")
NORMS = ("p", "trace")


def check_option(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """One clear error for an option outside its allowed values."""
    if value not in allowed:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)}")


def normaliser(s: np.ndarray, k: int, norm: str, p: float) -> np.ndarray:
    """``||S_K||_p`` or ``sum S_K`` over the last axis of ``s (..., >=K)``."""
    check_option("norm", norm, NORMS)
    top = np.abs(s[..., :k])
    return top.sum(axis=-1) if norm == "trace" else np.linalg.norm(top, ord=p, axis=-1)


def mis_coupling_from_stats(
    diag: np.ndarray,
    corner: np.ndarray,
    s_i: np.ndarray,
    k: int,
    reading: str = "authors",
    norm: str = "p",
    p: float = 2.0,
) -> np.ndarray:
    """m_K from statistics: ``diag (..., K_max)``, ``corner (..., K_max)``, J_i's singular values
    ``s_i (..., >=K)`` (broadcast against the pair axes). Returns ``(...)``.
    """
    check_option("reading", reading, READINGS)
    if not 1 <= k <= diag.shape[-1]:
        raise ValueError(f"K={k} is outside 1..{diag.shape[-1]} (K_max of the stored statistics)")
    dk, sk, total = diag[..., :k], s_i[..., :k], corner[..., k - 1]
    if reading == "authors":
        squared = total - 2.0 * np.sum(np.abs(dk) * sk, axis=-1) + np.sum(sk**2, axis=-1)
    else:
        squared = total - np.sum(dk**2, axis=-1)
    return np.sqrt(np.clip(squared, 0.0, None)) / normaliser(s_i, k, norm, p)
