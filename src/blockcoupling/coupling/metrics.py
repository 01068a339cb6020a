"""m_K values from the stored statistics (docs/datasets.md), for a K list, readings and norms.

Kept apart from extraction and torch-free: a change here re-runs the metrics rule, never the
Jacobians, and the analysis environment needs no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import xarray as xr

from blockcoupling.coupling.arguments import expect, expect_dataset, expect_ints
from blockcoupling.coupling.finite import WEIGHTS, require_finite
from blockcoupling.coupling.formulas import (
    NORMS,
    READINGS,
    check_option,
    mis_coupling_from_stats,
    mis_from_numerator,
)
from blockcoupling.coupling.null import (
    NULL_DRAWS,
    NULL_PICKS,
    NULL_POOL,
    NULL_SEED,
    spectrum_null,
)
from blockcoupling.coupling.registry import MEASURES, Measure, PairStats, chance_descriptions


class _MetricFields(NamedTuple):
    ks: tuple[int, ...] = (10, 30, 50)
    readings: tuple[str, ...] = READINGS
    norms: tuple[str, ...] = NORMS
    p: float = 2.0
    null_draws: int = NULL_DRAWS
    null_seed: int = NULL_SEED


class MetricConfig(_MetricFields):
    """Which m_K values ``coupling_dataset`` computes from the extracted statistics.

    Checked when built (a one-line ValueError naming the key). A tuple, so that the metrics
    rule re-runs when it changes (Snakemake compares only builtin params).

    Parameters
    ----------
    ks : tuple of int
        The K list of m_K; each K at most the extraction's ``k_max``.
    readings : tuple of str
        m_K readings: ``authors`` (the paper's) and/or ``offdiag``.
    norms : tuple of str
        Norms of m_K: ``p`` (the Schatten p-norm, ``p`` below) and/or ``trace``.
    p : float
        The Schatten p of the ``p`` norm.
    null_draws : int
        Haar-random bases of the spectrum-matched chance level (at least 2).
    null_seed : int
        Seed of those draws.

    Examples
    --------
    >>> import blockcoupling as bc
    >>> config = bc.MetricConfig(ks=(10,), readings=("authors",))
    >>> config.at((4, 10)).ks
    (4, 10)
    """

    __slots__ = ()

    def __init__(
        self,
        ks: tuple[int, ...] = (10, 30, 50),
        readings: tuple[str, ...] = READINGS,
        norms: tuple[str, ...] = NORMS,
        p: float = 2.0,
        null_draws: int = NULL_DRAWS,
        null_seed: int = NULL_SEED,
    ) -> None:
        """Check the fields the tuple was built with (one-line errors naming the key)."""
        expect_ints(self.ks, "MetricConfig(ks=...)")
        for key in ("ks", "readings", "norms"):
            if not isinstance(getattr(self, key), tuple):
                raise TypeError(f"metrics.{key} must be a tuple, got {getattr(self, key)!r}")
        expect(self.p, (int, float), "MetricConfig(p=...)")
        expect(self.null_draws, int, "MetricConfig(null_draws=...)")
        expect(self.null_seed, int, "MetricConfig(null_seed=...)")
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

    def at(self, ks: int | Sequence[int]) -> MetricConfig:
        """The same settings for another K list (checked).

        Parameters
        ----------
        ks : int or sequence of int
            The new K list (one K: a list of one).

        Returns
        -------
        MetricConfig
            A copy with ``ks`` replaced; this object is unchanged.
        """
        return MetricConfig(**{**self._asdict(), "ks": (ks,) if isinstance(ks, int) else tuple(ks)})

    def at_ks(self, ks: tuple[int, ...]) -> MetricConfig:
        """Deprecated: ``at`` (one name for changing K on every config type)."""
        import warnings

        warnings.warn(
            "MetricConfig.at_ks is renamed at; the old name will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.at(ks)

    def check_extractable(self, k_max: int, stored_ks: Sequence[int] | None) -> None:
        """Refuse, before any job, Ks the extraction cannot serve: one above ``extract.k_max``,
        or one whose statistics ``extract.stored_ks`` does not store.

        Parameters
        ----------
        k_max : int
            The extraction's largest K (``extract.k_max``).
        stored_ks : sequence of int or None
            The Ks whose statistics extraction stores (None: every K up to ``k_max``).

        Returns
        -------
        None
            A one-line ValueError naming ``metrics.ks`` and the key to change, else nothing.

        Examples
        --------
        >>> MetricConfig(ks=(2, 50)).check_extractable(k_max=32, stored_ks=None)
        Traceback (most recent call last):
        ...
        ValueError: metrics.ks has K=50 > extract.k_max=32; raise k_max or drop that K
        """
        if max(self.ks) > k_max:
            raise ValueError(
                f"metrics.ks has K={max(self.ks)} > extract.k_max={k_max}; "
                "raise k_max or drop that K"
            )
        missing = [k for k in self.ks if stored_ks is not None and k not in stored_ks]
        if missing:
            raise ValueError(
                f"metrics.ks has K={missing[0]}, which extract.stored_ks={list(stored_ks or ())}"
                " does not store; add it there or set it to metrics or all"
            )

    def over_chance(self, widths: Mapping[str, int], limit: float) -> dict[int, list[str]]:
        """The Ks whose chance overlap K/d is above ``limit`` for some model, with those models.

        Parameters
        ----------
        widths : mapping of str to int
            Each model's width d (its residual stream size).
        limit : float
            The largest chance overlap K/d still thought low.

        Returns
        -------
        dict of int to list of str
            K -> the sorted names of the models with K > limit * d, in the order of ``ks``;
            a K above no model's limit is left out.

        Examples
        --------
        >>> MetricConfig(ks=(2, 16)).over_chance({"a": 64, "b": 512}, 1 / 8)
        {16: ['a']}
        """
        over = {k: sorted(n for n, d in widths.items() if k > limit * d) for k in self.ks}
        return {k: names for k, names in over.items() if names}

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


def _mis_reduced(numerator2: xr.DataArray, s_i: xr.DataArray, config: MetricConfig) -> xr.DataArray:
    """m_K over (reading, norm, k, *pair dims) from the stored squared numerators
    ``numerator2 (*pair dims, reading, k)`` at the extraction's ``stored_ks``; ``s_i (...,
    rank)`` broadcasts over the pair dims. A K or reading not stored is a one-line error.
    """
    stored = [int(k) for k in numerator2["k"].values]
    missing = [k for k in config.ks if k not in stored]
    if missing:
        raise ValueError(
            f"K={missing[0]} is not among the Ks {stored} whose statistics were stored; add it "
            "to extract.stored_ks (or set it to all) and re-extract"
        )
    pair_dims = [d for d in numerator2.dims if d not in ("reading", "k")]
    template = numerator2.isel(reading=0, k=0, drop=True)
    s_b = s_i.broadcast_like(template).transpose(*pair_dims, "rank")
    norms = xr.DataArray(list(config.norms), dims="norm", coords={"norm": list(config.norms)})
    picked = numerator2.sel(reading=list(config.readings), k=list(config.ks))
    out = xr.apply_ufunc(  # loops over (reading, k, norm) only, as _mis_array
        lambda x, s, norm, k: mis_from_numerator(x, s, int(k), str(norm), config.p),
        picked.transpose("reading", "k", *pair_dims),
        s_b,
        norms,
        picked["k"],
        input_core_dims=[pair_dims, [*pair_dims, "rank"], [], []],
        output_core_dims=[pair_dims],
        vectorize=True,
    )
    return out.transpose("reading", "norm", "k", *pair_dims).drop_vars(
        [name for name, coord in out.coords.items() if "rank" in coord.dims]
    )


def _family_mis(
    data: xr.Dataset, prefix: str, s_i: xr.DataArray, config: MetricConfig
) -> xr.DataArray:
    """Raw m_K of one family (``prefix``: depth, self, fixed_in, fixed_out) from whichever
    statistics the extraction stored: every K (``_diag``, ``_corner``) or the squared
    numerators at its ``stored_ks`` (``_numerator2``).
    """
    if f"{prefix}_numerator2" in data:
        return _mis_reduced(data[f"{prefix}_numerator2"], s_i, config)
    corner = data[f"{prefix}_corner"].rename(k="kk")
    return _mis_array(data[f"{prefix}_diag"], corner, s_i, config)


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
    return {
        f"{prefix}_{m.name}": m.compute(stats)
        for m in MEASURES
        if stats.ucorner is not None or not m.reads_bases
    }


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


# The statistics of a depth dataset that coupling_dataset reads: a NaN or inf in one would give
# NaN (or silently wrong) measures for its prompt. A depth dataset holds either every K's diagonal
# and corner sums or, at the stored Ks (extract.stored_ks), m_K's squared numerator.
DEPTH_INPUTS = (
    "singular_values",
    "sv_sum2",
    "sv_sum4",
    "depth_diag",
    "depth_corner",
    "depth_numerator2",
    "depth_ucorner",
    "depth_vcorner",
)
DEPTH_LAYOUTS = (("depth_diag", "depth_corner"), ("depth_numerator2",))


def _of_model(dataset: xr.Dataset) -> str:
    return f" of {dataset.attrs['model']}" if "model" in dataset.attrs else ""


def coupling_dataset(depth: xr.Dataset, config: MetricConfig = MetricConfig()) -> xr.Dataset:
    """The coupling measures of the depth family, from the statistics ``extract`` returned.

    Every registered per-pair measure (``coupling.registry.MEASURES``), its chance level, the
    effective rank of every Jacobian, and the per-prompt summaries over block pairs.

    Parameters
    ----------
    depth : xarray.Dataset
        ``extract(...)["depth"]`` (or a workflow's ``results/extract/MODEL/STEP/depth.nc``).
    config : MetricConfig
        The K list, readings, norms and the chance level's draws.

    Returns
    -------
    xarray.Dataset
        ``depth_mis`` raw m_K ``(reading, norm, k, variant, prompt, layer, layer_ref)``;
        ``depth_null``/``depth_null_se (reading, norm, k, prompt, layer)`` its spectrum-matched
        null for J^layer; ``depth_excess`` = null - m_K; ``depth_overlap_u/_v (k, prompt, layer,
        layer_ref)``; ``effective_rank (prompt, layer)`` = (sum s^2)^2 / sum s^4. Summaries (per
        reading, norm, k, variant, prompt as they apply): ``coupling`` = minus the mean of
        ``depth_mis`` over l != l' and ``coupling_null`` the same of the null (what ``coupling``
        is at chance), ``adjacent_coupling`` over |l - l'| = 1, ``coupling_excess`` and
        ``adjacent_excess`` the mean excess, ``overlap_u``/``overlap_v`` the mean overlap over
        l != l', and ``overlap_null (k)`` = K/d. All dimensionless.

    Examples
    --------
    >>> import blockcoupling as bc
    >>> config = bc.ExtractConfig(k_max=10)
    >>> data = bc.extract(model, tokenizer, ["2 + 2 ="], config)  # doctest: +SKIP
    >>> coupling = bc.coupling_dataset(data["depth"], bc.MetricConfig(ks=(10,)))  # doctest: +SKIP
    >>> float(coupling["coupling_excess"].mean())  # doctest: +SKIP
    """
    expect_dataset(depth, "depth", "coupling_dataset(depth=...)")
    expect(config, MetricConfig, "coupling_dataset(config=...)")
    layout = next((names for names in DEPTH_LAYOUTS if names[0] in depth), ())
    other = {name for names in DEPTH_LAYOUTS for name in names} - set(layout)
    require_finite(
        depth,
        [name for name in DEPTH_INPUTS if name not in other],
        f"coupling_dataset: depth dataset{_of_model(depth)}",
        WEIGHTS,
    )
    d = _hidden_size(depth)
    s_i = depth["singular_values"]
    depth_mis = _family_mis(depth, "depth", s_i, config)
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
    ds.attrs["null_pool"], ds.attrs["null_picks"] = NULL_POOL, NULL_PICKS
    return ds


def token_coupling_dataset(tokens: xr.Dataset, config: MetricConfig = MetricConfig()) -> xr.Dataset:
    """Every registered per-pair measure of the token families (``self_*``, ``fixed_in_*``,
    ``fixed_out_*``: ``mis``, ``excess``, ``overlap_u``, ``overlap_v``), on the token layers and
    token prompts only; an empty dataset when none were extracted.
    """
    if "self_diag" not in tokens and "self_numerator2" not in tokens:
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
        mis = _family_mis(tokens, family, s_i, config)
        stats = PairStats(
            mis,
            nulls[family].drop_vars("prompt_source", errors="ignore"),
            tokens.get(f"{family}_ucorner"),
            tokens.get(f"{family}_vcorner"),
            config.ks,
            _hidden_size(tokens),
        )
        for name, values in _pair_measures(family, stats).items():
            data[name] = values.transpose(*mis.dims) if "variant" in values.dims else values
    return xr.Dataset(data, attrs={**tokens.attrs, "ks": list(config.ks), "p": config.p})
