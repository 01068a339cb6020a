"""The refusal of non-finite scores and coupling values: a NaN never enters the statistics
unnoticed (a correlation over the remaining models would quietly have a smaller n).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import xarray as xr

from blockcoupling.coupling.registry import summary_variables

WEIGHTS = "check the model's weights for NaN/Inf: a non-finite value is not written"
CHANGED = (
    "the file changed after its job wrote it (blockcoupling verify results/ names it): "
    "delete it and rerun"
)
# The per-prompt summaries of a metrics file that the statistics read (defined from two layers):
# every summary, adjacent summary and chance level of the measure registry.
SUMMARIES = summary_variables()


def require_finite(
    dataset: xr.Dataset, names: Iterable[str], where: str, fix: str = WEIGHTS
) -> None:
    """Raise a one-line ValueError naming ``where`` (the model and step), the measure and the
    coordinates of its first non-finite value, if any variable of ``names`` holds NaN or Inf;
    ``fix``: what to do about it.
    """
    for name in names:
        values = dataset[name]
        bad = ~np.isfinite(values.values)
        if not bad.any():
            continue
        index = np.unravel_index(int(np.argmax(bad)), bad.shape)
        at = ", ".join(
            f"{dim}={values[dim].values[i] if dim in values.coords else i}"
            for dim, i in zip(values.dims, index)
        )
        value = values.values[index]
        raise ValueError(
            f"{where}: {name} is {value}{f' at {at}' if at else ''} "
            f"({int(bad.sum())} of {bad.size} values not finite); {fix}"
        )


def scores_defined(result: xr.Dataset) -> list[str]:
    """The scores of an ``evaluate`` result that are defined (the accuracies need items with
    choices), hence must be finite.
    """
    accuracies = ["mc_accuracy", "mc_accuracy_norm"] if result.attrs["n_items"] else []
    return ["bits_per_byte", *accuracies]


def statistic_inputs(dataset: xr.Dataset, name: str) -> list[str]:
    """The variables of a per-model file (``name``: coupling or evaluation) that a statistic
    reads and that must therefore be finite: the per-prompt summaries of a model of two or more
    blocks, the defined evaluation scores.
    """
    if name == "coupling":
        two = dataset.sizes.get("layer", 0) > 1
        return [summary for summary in SUMMARIES if summary in dataset] if two else []
    if name == "evaluation":
        return scores_defined(dataset)
    return []


def require_rank(singular_values: xr.DataArray, k: int, width: int, where: str) -> None:
    """Raise a one-line ValueError naming ``where``, the first Jacobian (its coordinates) and its
    spectrum when a Jacobian's K-th singular value is zero at float32 precision
    (``s_K <= s_1 * width * eps``: a zero block, or rank below K). Its top-K bases are then
    arbitrary and m_K undefined (0/0 for a zero block); averaging over the remaining pairs would
    report a finite, wrong coupling. ``singular_values (..., rank)``, descending; ``width``: d.
    A NaN or inf among them is named as such first (``require_finite``), not as a low rank.
    """
    require_finite(xr.Dataset({"singular_values": singular_values}), ["singular_values"], where)
    values = singular_values.transpose(..., "rank")
    s = values.values
    top, kth = s[..., 0], s[..., k - 1]
    bad = ~(kth > top * width * np.finfo(np.float32).eps)
    if not bad.any():
        return
    index = np.unravel_index(int(np.argmax(bad)), bad.shape)
    dims = values.dims[:-1]
    at = ", ".join(
        f"{dim} {values[dim].values[i] if dim in values.coords else i}"
        for dim, i in zip(dims, index)
    )
    raise ValueError(
        f"{where}: the Jacobian at {at} has rank below K={k} (s_1 = {top[index]:.3g}, "
        f"s_{k} = {kth[index]:.3g}; {int(bad.sum())} of {bad.size} Jacobians): m_K is undefined "
        "for a zero or rank-deficient block (e.g. zeroed weights); lower K below its rank or "
        "leave the model out"
    )
