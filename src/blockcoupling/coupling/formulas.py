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


def squared_numerator(
    diag: np.ndarray, corner: np.ndarray, s_i: np.ndarray, k: int, reading: str = "authors"
) -> np.ndarray:
    """The square of m_K's numerator (times the normaliser: ``(m_K norm)^2``) from statistics
    ``diag (..., K_max)``, ``corner (..., K_max)`` and J_i's singular values ``s_i (..., >=K)``;
    may be slightly negative from rounding (``mis_from_numerator`` clips it). Returns ``(...)``.
    """
    check_option("reading", reading, READINGS)
    if not 1 <= k <= diag.shape[-1]:
        raise ValueError(f"K={k} is outside 1..{diag.shape[-1]} (K_max of the stored statistics)")
    dk, sk, total = diag[..., :k], s_i[..., :k], corner[..., k - 1]
    if reading == "authors":
        return total - 2.0 * np.sum(np.abs(dk) * sk, axis=-1) + np.sum(sk**2, axis=-1)
    return total - np.sum(dk**2, axis=-1)


def mis_from_numerator(
    squared: np.ndarray, s_i: np.ndarray, k: int, norm: str = "p", p: float = 2.0
) -> np.ndarray:
    """m_K from its squared numerator ``squared (...)`` (``squared_numerator``) and J_i's
    singular values ``s_i (..., >=K)``.
    """
    return np.sqrt(np.clip(squared, 0.0, None)) / normaliser(s_i, k, norm, p)


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
    return mis_from_numerator(squared_numerator(diag, corner, s_i, k, reading), s_i, k, norm, p)


def reduced_stats(
    diag: np.ndarray, corner: np.ndarray, s_i: np.ndarray, ks: tuple[int, ...]
) -> np.ndarray:
    """What m_K at the Ks ``ks`` reads of the statistics ``diag, corner (..., K_max)`` with J_i's
    singular values ``s_i`` (broadcast against them): the squared numerator of every reading
    (``READINGS`` order) at every K, ``(..., reading, k)`` float64. Stored in place of the
    statistics, m_K at those Ks follows exactly (``mis_from_numerator``) from 2 numbers per
    reading and K instead of ``2 K_max``.
    """
    s_b = np.broadcast_to(s_i, diag.shape)
    return np.stack(
        [
            np.stack([squared_numerator(diag, corner, s_b, k, r) for k in ks], axis=-1)
            for r in READINGS
        ],
        axis=-2,
    )
