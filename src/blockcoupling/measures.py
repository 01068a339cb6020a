"""The one registry of per-pair coupling measures (torch-free).

Each entry names a measure once: the variable suffix it is stored under (``depth_<name>`` for the
depth-wise family, ``<family>_<name>`` for the token families), how it is computed from the
stored sufficient statistics (a function of :class:`PairStats`), its no-effect level, its unit
and a description (docs/datasets.md documents every entry; a test checks it). ``metrics.py``
computes every registered measure for the depth-wise and token families, the summaries over
block pairs follow from ``summary``, and ``combine``/``vit_results`` keep whatever the metrics
hold. Adding a measure: one entry here (its function included), its test, its figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xarray as xr


@dataclass(frozen=True)
class PairStats:
    """What a family's measures are computed from, all for one file.

    ``mis``: raw m_K ``(reading, norm, k, variant, prompt, layer, layer_ref, *tokens)``;
    ``null``: its spectrum-matched null for each ``J_i`` (no ``layer_ref``/``variant``/reference
    token dims); ``ucorner``, ``vcorner``: cumulative corner sums of squares of ``U_i^T U_j``,
    ``V_i^T V_j`` ``(prompt, layer, layer_ref, *tokens, k)`` with ``k`` = 1..K_max; ``ks``: the K
    list.
    """

    mis: xr.DataArray
    null: xr.DataArray
    ucorner: xr.DataArray
    vcorner: xr.DataArray
    ks: Sequence[int]


def _overlap(corner: xr.DataArray, ks: Sequence[int]) -> xr.DataArray:
    """``||B_i,K^T B_j,K||_F^2 / K`` at every K of ``ks`` from the corner sums of ``B_i^T B_j``."""
    k = xr.DataArray(list(ks), dims="k", coords={"k": list(ks)})
    return corner.sel(k=list(ks)) / k


@dataclass(frozen=True)
class Measure:
    """One per-pair measure: stored as ``depth_<name>`` / ``<family>_<name>``; ``summary`` is
    the name of its per-prompt mean over block pairs l != l' (depth-wise; None: none).
    """

    name: str
    compute: Callable[[PairStats], xr.DataArray]
    null_level: str
    unit: str
    description: str
    summary: str | None = None


MEASURES: tuple[Measure, ...] = (
    Measure(
        "mis",
        lambda s: s.mis,
        "its spectrum-matched null (``null``): m_K of J_i in Haar-random bases",
        "dimensionless (0 = J_i diagonal in J_j's basis)",
        "m_K(J_i, J_j), the authors' mis-coupling (science.md); lower = more coupled",
    ),
    Measure(
        "excess",
        lambda s: s.null - s.mis,
        "0 (no more coupled than unrelated bases with J_i's own spectrum)",
        "same as m_K",
        "the null of m_K for J_i minus m_K(J_i, J_j); > 0 = more coupled than chance",
        summary="coupling_excess",
    ),
    Measure(
        "overlap_u",
        lambda s: _overlap(s.ucorner, s.ks),
        "K/d (Haar-random K-dimensional subspaces)",
        "fraction in [0, 1] (1 = the same top-K left singular subspace)",
        "||U_{i,K}^T U_{j,K}||_F^2 / K, overlap of the top-K left singular subspaces",
        summary="overlap_u",
    ),
    Measure(
        "overlap_v",
        lambda s: _overlap(s.vcorner, s.ks),
        "K/d (Haar-random K-dimensional subspaces)",
        "fraction in [0, 1] (1 = the same top-K right singular subspace)",
        "||V_{i,K}^T V_{j,K}||_F^2 / K, overlap of the top-K right singular subspaces",
        summary="overlap_v",
    ),
)


def measure(name: str) -> Measure:
    """The registered measure of that name."""
    for entry in MEASURES:
        if entry.name == name:
            return entry
    raise KeyError(f"no per-pair measure {name!r} (registered: {[m.name for m in MEASURES]})")
