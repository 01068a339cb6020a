"""The refusal of non-finite scores and coupling values: a NaN never enters the statistics
unnoticed (a correlation over the remaining models would quietly have a smaller n).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import xarray as xr


def require_finite(dataset: xr.Dataset, names: Iterable[str], where: str) -> None:
    """Raise a one-line ValueError naming ``where`` (the model and step), the measure and the
    coordinates of its first non-finite value, if any variable of ``names`` holds NaN or Inf.
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
            f"({int(bad.sum())} of {bad.size} values not finite); check the model's weights "
            "for NaN/Inf: a non-finite value is not written"
        )
