"""Argument checks of the public functions (``import blockcoupling as bc``): a wrong type, or a
dataset of another kind than the function reads, is a one-line TypeError naming the argument
and what was expected, before any work. Torch-free and in the lowest layer, so that every
package's public functions use the same words.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral, Real
from os import PathLike
from typing import Any

import numpy as np
import xarray as xr

# A dataset's kind, from the variable that only that kind holds (the first match wins: an
# extraction's depth dataset also holds singular values, as a spectra file does).
KIND_MARKERS = (
    # measure(...)["depth"], extract/<model>/<step>/depth.nc (every K's sums, or m_K's squared
    # numerator at the stored Ks: extract.stored_ks)
    ("depth", "depth_diag"),
    ("depth", "depth_numerator2"),
    ("token statistics", "self_diag"),  # measure(...)["tokens"] (the token families' inputs)
    ("token statistics", "self_numerator2"),
    ("coupling", "depth_mis"),  # coupling_dataset, metrics/<model>/<step>/coupling.nc
    ("tokens", "self_mis"),  # the token families' m_K, metrics/.../token_coupling.nc
    ("trajectories", "step_norm"),  # measure(...)["trajectories"]
    ("evaluation", "bits_per_byte"),  # the evaluate rule's scores
    ("spectra", "singular_values"),  # measure(...)["spectra"]
)
WHERE_FROM = {
    "depth": "measure(...)['depth'] or an extract depth.nc",
    "coupling": "coupling_dataset(depth) or a metrics coupling.nc",
}


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def expect(value: Any, types: type | tuple[type, ...], what: str) -> None:
    """TypeError naming ``what`` (e.g. ``measure(prompts=...)``) unless ``value`` is one of
    ``types``; a bool never passes for a number.
    """
    allowed = types if isinstance(types, tuple) else (types,)
    numeric = any(t in (int, float) for t in allowed) and bool not in allowed
    # numpy's integers and floats (a K read from a dataset's coordinate) are numbers too
    accepted = allowed + (Integral,) * (int in allowed) + (Real,) * (float in allowed)
    if not isinstance(value, accepted) or (numeric and isinstance(value, (bool, np.bool_))):
        names = " or ".join(t.__name__ for t in allowed)
        raise TypeError(f"{what}: expected {names}, got {_shown(value)}")


def expect_path(value: Any, what: str) -> None:
    """TypeError unless ``value`` is a file name (str or os.PathLike)."""
    expect(value, (str, PathLike), what)


def expect_ints(values: Any, what: str) -> None:
    """TypeError unless ``values`` is a non-string iterable of ints (no bools)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what}: expected a list of ints, got {_shown(values)}")
    for value in values:
        expect(value, int, f"{what} item")


def expect_seed(seed: Any, what: str) -> None:
    """TypeError unless an int, ValueError unless within torch's and NetCDF's 0..2**63-1."""
    expect(seed, int, what)
    if not 0 <= seed <= 2**63 - 1:
        raise ValueError(f"{what}: {seed} is outside 0..2**63-1; give a smaller seed")


def dataset_kind(dataset: xr.Dataset) -> str:
    """``depth``, ``coupling``, ``tokens``, ... (``KIND_MARKERS``); ``empty`` without variables,
    ``unknown`` otherwise.
    """
    for kind, marker in KIND_MARKERS:
        if marker in dataset.data_vars:
            return kind
    return "empty" if not dataset.data_vars else "unknown"


def expect_dataset(dataset: Any, kinds: str | tuple[str, ...], what: str) -> None:
    """TypeError unless ``dataset`` is an xarray Dataset of one of ``kinds``."""
    expect(dataset, xr.Dataset, what)
    wanted = kinds if isinstance(kinds, tuple) else (kinds,)
    kind = dataset_kind(dataset)
    if kind not in wanted:
        hint = "; ".join(WHERE_FROM[k] for k in wanted if k in WHERE_FROM)
        raise TypeError(
            f"{what}: expected a {' or '.join(wanted)} dataset{f' ({hint})' if hint else ''}, "
            f"got a {kind} dataset (variables {', '.join(list(map(str, dataset.data_vars))[:4])})"
        )
