"""m_K values from the stored statistics (docs/datasets.md), for a K list, readings and norms.

Kept apart from extraction and torch-free: a change here re-runs the metrics rule, never the
Jacobians, and the analysis environment needs no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import xarray as xr

from blockcoupling.coupling.formulas import NORMS, READINGS, check_option, mis_coupling_from_stats
from blockcoupling.coupling.null import NULL_DRAWS, NULL_POOL, NULL_SEED, spectrum_null
from blockcoupling.coupling.registry import MEASURES, Measure, PairStats, chance_descriptions


class _MetricFields(NamedTuple):
    ks: tuple[int, ...] = (10, 30, 50)
    readings: tuple[str, ...] = READINGS
    norms: tuple[str, ...] = NORMS
    p: float = 2.0
    null_draws: int = NULL_DRAWS
    null_seed: int = NULL_SEED


class MetricConfig(_MetricFields):
    """Which m_K values to compute from the statistics: the K list, readings, norms, p, and
    the null's draws and seed. Checked when built; a tuple, so that the metrics rule re-runs
    when it changes (Snakemake compares only builtin params).
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> MetricConfig:
        """Built as a NamedTuple, then checked (one-line ValueError naming the key)."""
        self = super().__new__(cls, *args, **kwargs)
        for reading in self.readings:
            check_option("reading", reading, READINGS)
        for norm in self.norms:
            check_option("norm", norm, NORMS)
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"metrics.ks must be a non-empty list of K >= 1, got {list(self.ks)}")
        if not 2 <= self.null_draws <= NULL_POOL:
            raise ValueError(
                f"metrics.null_draws must be in 2..{NULL_POOL} (the null's pool), "
                f"got {self.null_draws}"
            )
        return self

    def at_ks(self, ks: tuple[int, ...]) -> MetricConfig:
        """The same settings for another K list (checked)."""
        return MetricConfig(**{**self._asdict(), "ks": tuple(ks)})

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> MetricConfig:
        """From the config's ``metrics`` section (schema defaults already filled in)."""
        known = set(cls._fields)
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


def null_array(
    s_i: xr.DataArray, sv_sum2: xr.DataArray, d: int, config: MetricConfig
) -> tuple[xr.DataArray, xr.DataArray]:
    """The spectrum-matched null of m_K of every Jacobian and its Monte Carlo standard error,
    each ``(reading, norm, k, *dims of sv_sum2)``, from its top singular values ``s_i (...,
    rank)`` and the sum of squares of its full spectrum ``sv_sum2 (...)`` (``null.py``).
    """
    dims = list(sv_sum2.dims)
    mean, se = spectrum_null(
        s_i.transpose(*dims, "rank").values,
        sv_sum2.values,
        d,
        tuple(config.ks),
        tuple(config.readings),
        tuple(config.norms),
        config.p,
        config.null_draws,
        config.null_seed,
    )
    grid = {"reading": list(config.readings), "norm": list(config.norms), "k": list(config.ks)}

    def array(values: np.ndarray) -> xr.DataArray:
        return xr.DataArray(values, dims=(*grid, *dims), coords={**grid, **sv_sum2.coords})

    return array(mean), array(se)


def _hidden_size(data: xr.Dataset) -> int:
    if "hidden_size" not in data.attrs:
        raise ValueError(
            "the extracted statistics lack attr hidden_size (extracted before the calibrated "
            "measures): re-run their extraction"
        )
    return int(data.attrs["hidden_size"])


def _pair_measures(prefix: str, stats: PairStats) -> dict[str, xr.DataArray]:
    """Every registered measure of one family, named ``<prefix>_<measure>``."""
    return {f"{prefix}_{m.name}": m.compute(stats) for m in MEASURES}


def _summary_chance(entry: Measure, stats: PairStats) -> xr.DataArray:
    """The chance level of ``entry``'s summary over pairs l != l': its per-block chance level
    averaged over blocks (each J_i is J_i of L - 1 pairs), times its sign.
    """
    level = entry.chance(stats)
    if not isinstance(level, xr.DataArray):  # a constant: one value for the whole file
        level = xr.DataArray(float(level))
    if "layer" in level.dims:
        level = level.mean("layer")
    return -level if entry.sign < 0 else level


def coupling_dataset(depth: xr.Dataset, config: MetricConfig = MetricConfig()) -> xr.Dataset:
    """Every registered per-pair measure (``coupling.registry.MEASURES``) of the depth family, its
    null, the effective rank of every Jacobian, and the per-prompt summaries over block pairs.

    ``depth_mis`` is raw m_K; ``depth_null``/``depth_null_se (reading, norm, k, prompt, layer)``
    its spectrum-matched null for J^layer; ``depth_excess`` = null - m_K; ``depth_overlap_u/_v
    (k, prompt, layer, layer_ref)``; ``effective_rank (prompt, layer)`` = (sum s^2)^2 / sum s^4.
    Summaries (per reading, norm, k, variant, prompt as they apply): ``coupling`` = minus the
    mean of ``depth_mis`` over l != l' and ``coupling_null`` the same of the null (what
    ``coupling`` is at chance), ``adjacent_coupling`` over |l - l'| = 1, ``coupling_excess`` and
    ``adjacent_excess`` the mean excess, ``overlap_u``/``overlap_v`` the mean overlap over
    l != l', and ``overlap_null (k)`` = K/d.
    """
    d = _hidden_size(depth)
    s_i = depth["singular_values"]
    depth_mis = _mis_array(depth["depth_diag"], depth["depth_corner"].rename(k="kk"), s_i, config)
    null, null_se = null_array(s_i, depth["sv_sum2"], d, config)
    stats = PairStats(depth_mis, null, depth["depth_ucorner"], depth["depth_vcorner"], config.ks, d)
    data = _pair_measures("depth", stats)
    layer, layer_ref = depth_mis["layer"], depth_mis["layer_ref"]
    pairs, adjacent = layer != layer_ref, abs(layer - layer_ref) == 1

    def over(values: xr.DataArray, where: xr.DataArray, sign: int) -> xr.DataArray:
        mean = values.where(where).mean(("layer", "layer_ref"))
        return -mean if sign < 0 else mean

    data.update(
        depth_null=null,
        depth_null_se=null_se,
        effective_rank=depth["sv_sum2"] ** 2 / depth["sv_sum4"],
    )
    for entry in MEASURES:
        values = data[f"depth_{entry.name}"]
        if entry.summary:
            data[entry.summary] = over(values, pairs, entry.sign)
        if entry.adjacent:
            data[entry.adjacent] = over(values, adjacent, entry.sign)
        if isinstance(entry.summary_chance, str) and entry.summary_chance not in data:
            data[entry.summary_chance] = _summary_chance(entry, stats)
    ds = xr.Dataset(data, attrs={**depth.attrs, "ks": list(config.ks), "p": config.p})
    ds["depth_mis"] = ds["depth_mis"].transpose(*depth_mis.dims)
    ds["depth_excess"] = ds["depth_excess"].transpose(*depth_mis.dims)
    for variable in ds.data_vars.values():  # not the statistics' descriptions they came from
        variable.attrs = {}
    for entry in MEASURES:
        ds[f"depth_{entry.name}"].attrs.update(
            description=entry.description, null_level=entry.null_level, unit=entry.unit
        )
        if entry.summary:
            ds[entry.summary].attrs["description"] = entry.summary_description
    ds["depth_null"].attrs["description"] = (
        "expected m_K of J^layer in Haar-random bases with its own singular values (Monte Carlo)"
    )
    ds["depth_null_se"].attrs["description"] = "Monte Carlo standard error of depth_null"
    ds["effective_rank"].attrs["description"] = "participation ratio (sum s^2)^2 / sum s^4"
    for name, description in chance_descriptions().items():
        ds[name].attrs["description"] = description
    ds.attrs["null_draws"], ds.attrs["null_seed"] = config.null_draws, config.null_seed
    return ds


def token_coupling_dataset(tokens: xr.Dataset, config: MetricConfig = MetricConfig()) -> xr.Dataset:
    """Every registered per-pair measure of the token families (``self_*``, ``fixed_in_*``,
    ``fixed_out_*``: ``mis``, ``excess``, ``overlap_u``, ``overlap_v``), on the token layers and
    token prompts only; an empty dataset when none were extracted.
    """
    if "self_diag" not in tokens:
        return xr.Dataset(attrs={**tokens.attrs, "ks": list(config.ks), "p": config.p})
    s_tok = tokens["singular_values"]  # (prompt, layer, token_in, token_out, rank): J_{t1 t2}
    null, _ = null_array(s_tok, tokens["sv_sum2"], _hidden_size(tokens), config)

    def diagonal(values: xr.DataArray) -> xr.DataArray:  # J_tt of (..., token_in, token_out)
        rest = [dim for dim in values.dims if dim not in ("token_in", "token_out")]
        values = values.transpose(*rest, "token_in", "token_out")
        return xr.DataArray(
            np.diagonal(values.values, axis1=-2, axis2=-1),
            dims=(*rest, "token"),
            coords={**{dim: values[dim] for dim in rest}, "token": tokens["token"].values},
        )

    # J_i of each family: self J_tt; fixed_in J_{token_in, token}; fixed_out J_{token, token_out}
    spectra = {
        "self": diagonal(s_tok).transpose("prompt", "layer", "token", "rank"),
        "fixed_in": s_tok.rename(token_out="token"),
        "fixed_out": s_tok.rename(token_in="token"),
    }
    nulls = {
        "self": diagonal(null),
        "fixed_in": null.rename(token_out="token"),
        "fixed_out": null.rename(token_in="token"),
    }
    data = {}
    for family, s_i in spectra.items():
        mis = _mis_array(
            tokens[f"{family}_diag"], tokens[f"{family}_corner"].rename(k="kk"), s_i, config
        )
        stats = PairStats(
            mis,
            nulls[family].drop_vars("prompt_source", errors="ignore"),
            tokens[f"{family}_ucorner"],
            tokens[f"{family}_vcorner"],
            config.ks,
            _hidden_size(tokens),
        )
        for name, values in _pair_measures(family, stats).items():
            data[name] = values.transpose(*mis.dims) if "variant" in values.dims else values
    return xr.Dataset(data, attrs={**tokens.attrs, "ks": list(config.ks), "p": config.p})
