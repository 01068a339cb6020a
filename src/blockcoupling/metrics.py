"""m_K values from the stored statistics (docs/datasets.md), for a K list, readings and norms.

Kept apart from extraction and torch-free: a change here re-runs the metrics rule, never the
Jacobians, and the analysis environment needs no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import xarray as xr

from blockcoupling.formulas import NORMS, READINGS, check_option, mis_coupling_from_stats


@dataclass(frozen=True)
class MetricConfig:
    """Which m_K values to compute from the statistics: the K list, readings, norms, p."""

    ks: tuple[int, ...] = (10, 30, 50)
    readings: tuple[str, ...] = READINGS
    norms: tuple[str, ...] = NORMS
    p: float = 2.0

    def __post_init__(self) -> None:
        for reading in self.readings:
            check_option("reading", reading, READINGS)
        for norm in self.norms:
            check_option("norm", norm, NORMS)
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"metrics.ks must be a non-empty list of K >= 1, got {list(self.ks)}")

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> MetricConfig:
        """From the config's ``metrics`` section (schema defaults already filled in)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(
                f"metrics: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        values = {key: tuple(v) if isinstance(v, list) else v for key, v in section.items()}
        if "p" in values:
            values["p"] = float(values["p"])
        return cls(**values)


def _mis_array(
    diag: xr.DataArray, corner: xr.DataArray, s_i: xr.DataArray, config: MetricConfig
) -> xr.DataArray:
    """m_K over (reading, norm, k, *pair dims) from statistics ``diag (..., rank)``, ``corner
    (..., kk)``; ``s_i (..., rank)`` broadcasts over the pair dims.
    """
    k_max = diag.sizes["rank"]
    too_big = [k for k in config.ks if k > k_max]
    if too_big:
        raise ValueError(
            f"K={too_big[0]} exceeds K_max={k_max} of the extracted statistics; "
            "re-extract with a larger k_max"
        )
    pair_dims = list(diag.dims[:-1])
    core = [*pair_dims, "rank"]
    s_b = s_i.broadcast_like(diag.isel(rank=0, drop=True)).transpose(*core)
    grid = xr.Dataset(
        coords={"reading": list(config.readings), "norm": list(config.norms), "k": list(config.ks)}
    )
    out = xr.apply_ufunc(  # loops over (reading, norm, k) only: each call is one vectorised formula
        lambda d, c, s, reading, norm, k: mis_coupling_from_stats(
            d, c, s, int(k), str(reading), str(norm), config.p
        ),
        diag.transpose(*core),
        corner.drop_vars("kk").rename(kk="rank").transpose(*core),
        s_b,
        grid["reading"],
        grid["norm"],
        grid["k"],
        input_core_dims=[core, core, core, [], [], []],
        output_core_dims=[pair_dims],
        vectorize=True,
    )
    return out.transpose("reading", "norm", "k", *pair_dims).drop_vars(
        [name for name, coord in out.coords.items() if "rank" in coord.dims]
    )


def coupling_dataset(depth: xr.Dataset, config: MetricConfig = MetricConfig()) -> xr.Dataset:
    """m_K of every depth pair, and the per-prompt model summaries.

    ``coupling`` = minus the mean of ``depth_mis`` over l != l'; ``adjacent_coupling`` = minus the
    mean over |l - l'| = 1 (both per reading, norm, k, variant, prompt).
    """
    depth_mis = _mis_array(
        depth["depth_diag"], depth["depth_corner"].rename(k="kk"), depth["singular_values"], config
    )
    layer, layer_ref = depth_mis["layer"], depth_mis["layer_ref"]
    data = {
        "depth_mis": depth_mis,
        "coupling": -depth_mis.where(layer != layer_ref).mean(("layer", "layer_ref")),
        "adjacent_coupling": -depth_mis.where(abs(layer - layer_ref) == 1).mean(
            ("layer", "layer_ref")
        ),
    }
    ds = xr.Dataset(data, attrs={**depth.attrs, "ks": list(config.ks), "p": config.p})
    ds["depth_mis"].attrs["description"] = "m_K(J^layer, J^layer_ref) at the depth token"
    ds["coupling"].attrs["description"] = "minus the mean m_K over layer pairs l != l'"
    return ds


def token_coupling_dataset(tokens: xr.Dataset, config: MetricConfig = MetricConfig()) -> xr.Dataset:
    """m_K of the token families (``self_mis``, ``fixed_in_mis``, ``fixed_out_mis``), on the token
    layers and token prompts only; an empty dataset when none were extracted.
    """
    if "self_diag" not in tokens:
        return xr.Dataset(attrs={**tokens.attrs, "ks": list(config.ks), "p": config.p})
    s_tok = tokens["singular_values"]  # (prompt, layer, token_in, token_out, rank): J_{t1 t2}
    # J_i of each family: self J_tt; fixed_in J_{token_in, token}; fixed_out J_{token, token_out}
    s_self = xr.DataArray(
        np.diagonal(s_tok.values, axis1=2, axis2=3),
        dims=("prompt", "layer", "rank", "token"),
        coords={
            "prompt": s_tok["prompt"],
            "layer": s_tok["layer"],
            "rank": s_tok["rank"],
            "token": tokens["token"].values,
        },
    ).transpose("prompt", "layer", "token", "rank")
    spectra = {
        "self": s_self,
        "fixed_in": s_tok.rename(token_out="token"),
        "fixed_out": s_tok.rename(token_in="token"),
    }
    data = {
        f"{family}_mis": _mis_array(
            tokens[f"{family}_diag"], tokens[f"{family}_corner"].rename(k="kk"), s_i, config
        )
        for family, s_i in spectra.items()
    }
    return xr.Dataset(data, attrs={**tokens.attrs, "ks": list(config.ks), "p": config.p})
