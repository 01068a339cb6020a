"""The ViT sweep's one dataset: coupling and test accuracy of every grid point, torch-free.

``grid_dataset`` turns each grid point's extracted statistics (``depth.nc``, ``tokens.nc``) into
m_K (``metrics``) and stacks them with each run's final test accuracy along ``sd``, ``wd`` and
``seed``; the extraction's ``prompt`` dim becomes ``image`` (``image_label``: the class).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset, token_coupling_dataset
from blockcoupling.coupling.registry import summary_variables

Point = tuple[float, float, int]  # (drop-path rate, weight decay, seed)
FAMILIES = ("self", "fixed_in", "fixed_out")
FIXED = ("token_in", "token_out")  # the fixed token of the context families


def token_summaries(token_coupling: xr.Dataset) -> xr.Dataset:
    """Per token family: minus the mean m_K over token pairs t != t' (and over the fixed token)
    at each token layer against itself: ``{family}_token_coupling (reading, norm, k, variant,
    token_image, token_layer)``. Empty when no token families were extracted.
    """
    out = {}
    for family in FAMILIES:
        name = f"{family}_mis"
        if name not in token_coupling:
            continue
        mis = token_coupling[name]
        layers = mis["layer"].values
        same = xr.concat(
            [mis.sel(layer=x, layer_ref=x).drop_vars("layer_ref") for x in layers], dim="layer"
        )
        distinct = same.where(same["token"] != same["token_ref"])
        dims = ["token", "token_ref", *(d for d in FIXED if d in distinct.dims)]
        out[f"{family}_token_coupling"] = -distinct.mean(dims, skipna=True)
    data = xr.Dataset(out)
    if not out:
        return data
    return data.rename(prompt="token_image", layer="token_layer").drop_vars(
        [c for c in ("prompt_source", "n_tokens") if c in data.coords]
    )


def _point(
    depth: xr.Dataset, tokens: xr.Dataset, history: pd.DataFrame, metric: MetricConfig
) -> xr.Dataset:
    """One grid point: coupling per image, the mean depth m_K map, token summaries, accuracy."""
    coupling = coupling_dataset(depth, metric)
    data = xr.Dataset(
        {
            **{name: coupling[name] for name in (*summary_variables(), "effective_rank")},
            "depth_mis": coupling["depth_mis"].mean("prompt"),
            "depth_excess": coupling["depth_excess"].mean("prompt"),
        }
    )
    data = data.rename(prompt="image", prompt_source="image_label").drop_vars(
        [c for c in ("n_tokens", "token_position") if c in data.coords]
    )
    data = data.merge(token_summaries(token_coupling_dataset(tokens, metric)))
    last = history.iloc[-1]
    for column in ("test_accuracy", "test_loss", "train_loss"):
        data[column] = float(last[column])
    data["test_accuracy_curve"] = xr.DataArray(
        history["test_accuracy"].to_numpy(dtype=float),
        dims="epoch",
        coords={"epoch": history["epoch"].to_numpy(dtype=int)},
    )
    return data


def grid_dataset(
    parts: Mapping[Point, tuple[xr.Dataset, xr.Dataset, pd.DataFrame]],
    metric: MetricConfig,
    attrs: dict[str, Any] | None = None,
) -> xr.Dataset:
    """``parts``: ``(sd, wd, seed) -> (depth, tokens, history)`` of every grid point. Returns
    ``coupling``, ``adjacent_coupling (sd, wd, seed, reading, norm, k, variant, image)``,
    ``depth_mis``, ``depth_excess (sd, wd, seed, reading, norm, k, variant, layer, layer_ref)``
    (mean over images), the calibrated summaries ``coupling_null``, ``coupling_excess``,
    ``adjacent_excess``, ``overlap_u``, ``overlap_v`` (per image, as ``metrics.coupling_dataset``
    gives them), ``overlap_null (k)``, ``effective_rank (..., image, layer)``,
    ``{family}_token_coupling (..., token_image, token_layer)``, ``test_accuracy``,
    ``test_loss``, ``train_loss (sd, wd, seed)`` (after the last epoch) and
    ``test_accuracy_curve (sd, wd, seed, epoch)``.
    """
    if not parts:
        raise ValueError("no grid points to combine")
    check_same_images(parts)
    points = []
    for (sd, wd, seed), (depth, tokens, history) in sorted(parts.items()):
        point = _point(depth, tokens, history, metric)
        points.append(point.expand_dims(sd=[float(sd)], wd=[float(wd)], seed=[int(seed)]))
    labels = points[0]["image_label"]
    data = xr.merge(  # grid points never overlap: any conflict is an error, not an override
        [p.drop_vars("image_label") for p in points], join="outer", compat="no_conflicts"
    )
    data = data.assign_coords(image_label=labels)
    data.attrs.update(attrs or {})
    data.attrs.update(ks=list(metric.ks), p=metric.p)
    data["coupling"].attrs["description"] = "minus the mean m_K over block pairs l != l'"
    data["test_accuracy"].attrs["description"] = "fraction of the test split, after training"
    return data


RUN_ATTRS = ("drop_path_rate", "weight_decay", "seed")  # the grid point, in each file's attrs


def read_part(part: Mapping[str, Any]) -> tuple[Point, tuple[xr.Dataset, xr.Dataset, pd.DataFrame]]:
    """One grid point of ``ViTPlan.parts``: its point and its (depth, tokens, history), each
    extraction file checked to hold the run it is named for (its attrs, written from the run
    config); ValueError naming the file otherwise.
    """
    from blockcoupling.files.io import read_netcdf

    point = (float(part["point"][0]), float(part["point"][1]), int(part["point"][2]))
    depth, tokens = read_netcdf(part["depth"]), read_netcdf(part["tokens"])
    for path, data in ((part["depth"], depth), (part["tokens"], tokens)):
        held = tuple(np.asarray(data.attrs.get(name)).tolist() for name in RUN_ATTRS)
        if held != point:
            raise ValueError(
                f"{path} holds the ViT run {dict(zip(RUN_ATTRS, held))}, not the grid point "
                f"{dict(zip(RUN_ATTRS, point))} it is named for; delete it to re-extract"
            )
    return point, (depth, tokens, pd.read_csv(part["history"]))


def check_same_images(parts: Mapping[Point, tuple[xr.Dataset, xr.Dataset, pd.DataFrame]]) -> None:
    """Every grid point must have been measured on the same images (ids in the same order)."""
    reference = None
    for point, (depth, _, _) in parts.items():
        ids = list(np.asarray(depth["prompt"].values).astype(str))
        if reference is None:
            reference = ids
        elif ids != reference:
            raise ValueError(f"grid point {point} was measured on other images than the first")
