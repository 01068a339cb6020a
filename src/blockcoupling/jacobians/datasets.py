"""The xarray datasets that ``measure`` returns (docs/datasets.md), built from per-prompt results.

Torch-free: extraction (``jacobians.extract``) hands numpy arrays over in ``DepthResult`` and
``TokenResult``; every function here only lays them out with named dims and coords.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from blockcoupling.coupling.formulas import READINGS, reduced_stats
from blockcoupling.jacobians import trajectories
from blockcoupling.jacobians.options import ExtractConfig, PromptText


@dataclass
class DepthResult:
    """Depth-wise statistics of one prompt (numpy, float64)."""

    s: np.ndarray  # (layer, rank): the top K_max singular values
    diag: np.ndarray  # (variant, layer, layer_ref, rank)
    corner: np.ndarray  # (variant, layer, layer_ref, k)
    spectrum: np.ndarray | None = None  # (layer, d): every singular value, where asked
    ucorner: np.ndarray | None = None  # (layer, layer_ref, k): corner sums of U_i^T U_j
    vcorner: np.ndarray | None = None  # (layer, layer_ref, k): the same for V
    sv_sum2: np.ndarray | None = None  # (layer,): sum of s^2 over the full spectrum
    sv_sum4: np.ndarray | None = None  # (layer,): sum of s^4
    u: np.ndarray | None = None  # (layer, d, rank)
    v: np.ndarray | None = None


@dataclass
class TokenResult:
    """Token-family statistics of one prompt: spectra per layer, (diag, corner) per family and
    layer pair.
    """

    s: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (token_in, token_out, rank)
    families: dict[str, dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]] = field(
        default_factory=dict
    )
    # family -> (layer, layer_ref) -> (ucorner, vcorner), each (*family token dims, k)
    bases: dict[str, dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]] = field(
        default_factory=dict
    )
    sv_sum2: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (token_in, token_out)
    sv_sum4: dict[int, np.ndarray] = field(default_factory=dict)


def pad(arrays: list[np.ndarray], axes: Sequence[int]) -> np.ndarray:
    """Stack arrays along a new first axis, NaN-padding the given (token) axes to the maximum."""
    shape = list(arrays[0].shape)
    for axis in axes:
        shape[axis] = max(a.shape[axis] for a in arrays)
    out = np.full((len(arrays), *shape), np.nan)
    for i, array in enumerate(arrays):
        out[(i, *tuple(slice(0, s) for s in array.shape))] = array
    return out


NUMERATOR2_DESCRIPTION = (
    "(m_K times its normaliser)^2 of A = P_j^T J_i Q_j: authors corner[K] - 2 sum_{a<K} "
    "|A[a, a]| S_i[a] + sum_{a<K} S_i[a]^2, offdiag corner[K] - sum_{a<K} A[a, a]^2"
)


def _k_coords(config: ExtractConfig) -> dict[str, Any]:
    """The ``rank`` coord (``k_max``) and the ``k`` coord of the stored statistics (every K up to
    ``k_max``, or ``stored_ks``), with ``variant`` and, when reduced, ``reading``.
    """
    ks = np.arange(1, config.k_max + 1) if config.stored_ks is None else list(config.stored_ks)
    coords: dict[str, Any] = {
        "rank": np.arange(config.k_max),
        "k": ks,
        "variant": list(config.variants),
    }
    if config.stored_ks is not None:
        coords["reading"] = list(READINGS)
    return coords


def _pair_variables(
    prefix: str,
    stats: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    bases: list[tuple[np.ndarray, ...]] | None,
    dims: tuple[str, ...],
    stored_ks: tuple[int, ...] | None,
    axis: int,
    pad_axes: tuple[int, ...] = (),
) -> dict[str, Any]:
    """A family's pair statistics, one item per prompt: ``(diag, corner (variant, *pair,
    K_max), s_i (broadcast against them))`` and ``(ucorner, vcorner (*pair, K_max))``, stacked
    along ``axis`` (the prompt axis of ``dims``; ``pad_axes``: NaN-padded to the longest item,
    numbered as in the stats items). ``stored_ks`` None: ``{prefix}_diag``/``_corner``; else
    ``{prefix}_numerator2 (*dims, reading, k)`` (``formulas.reduced_stats``); the basis corners
    at those Ks only (none when ``bases`` is None).
    """

    def stack(arrays: list[np.ndarray], at: int, axes: tuple[int, ...]) -> np.ndarray:
        return np.moveaxis(pad(arrays, axes), 0, at) if axes else np.stack(arrays, axis=at)

    pair_dims = tuple(d for d in dims if d != "variant")
    base_axes = tuple(a - 1 for a in pad_axes)  # the items' variant axis is not there
    if stored_ks is None:
        out = {
            f"{prefix}_diag": ((*dims, "rank"), stack([d for d, _, _ in stats], axis, pad_axes)),
            f"{prefix}_corner": ((*dims, "k"), stack([c for _, c, _ in stats], axis, pad_axes)),
        }
        pick: Any = slice(None)
    else:
        reduced = [reduced_stats(d, c, s, stored_ks) for d, c, s in stats]
        out = {f"{prefix}_numerator2": ((*dims, "reading", "k"), stack(reduced, axis, pad_axes))}
        pick = [k - 1 for k in stored_ks]
    for i, name in enumerate(("ucorner", "vcorner") if bases is not None else ()):
        picked = [b[i][..., pick] for b in bases]
        out[f"{prefix}_{name}"] = ((*pair_dims, "k"), stack(picked, 0, base_axes))
    return out


def _family_spectra(family: str, spectra: np.ndarray) -> np.ndarray:
    """The singular values of each family's ``J_i`` from those of every ``J_{t1 t2}``
    ``spectra (layer, token_in, token_out, K)``, shaped to broadcast against the family's
    statistics ``(variant, layer, layer_ref, *FAMILY_DIMS[family], K)``: self ``J_tt``, fixed
    input ``J_{token_in, token}``, fixed output ``J_{token, token_out}``.
    """
    if family == "self":
        own = np.moveaxis(np.diagonal(spectra, axis1=1, axis2=2), -1, 1)  # (layer, token, K)
        return own[None, :, None, :, None, :]
    if family == "fixed_out":
        spectra = spectra.transpose(0, 2, 1, 3)  # (layer, token_out, token, K)
    return spectra[None, :, None, :, :, None, :]


def depth_dataset(
    results: list[DepthResult],
    prompt_coords: dict[str, Any],
    positions: list[int],
    config: ExtractConfig,
    attrs: dict[str, Any],
) -> xr.Dataset:
    """The ``depth`` dataset: ``singular_values (prompt, layer, rank)``, ``depth_diag`` and
    ``depth_corner (variant, prompt, layer, layer_ref, rank|k)`` (``config.stored_ks``:
    ``depth_numerator2 (variant, prompt, layer, layer_ref, reading, k)`` instead), and
    ``u, v (prompt, layer, dim, rank)`` when ``config.store_factors``; coord ``token_position``.
    """
    n_layers = results[0].s.shape[0]
    k = config.k_max
    dims_pair = ("variant", "prompt", "layer", "layer_ref")
    data = {
        "singular_values": (("prompt", "layer", "rank"), np.stack([r.s[:, :k] for r in results])),
        **_pair_variables(
            "depth",
            [(r.diag, r.corner, r.s[:, None, :]) for r in results],
            [(r.ucorner, r.vcorner) for r in results],
            dims_pair,
            config.stored_ks,
            axis=1,
        ),
        "sv_sum2": (("prompt", "layer"), np.stack([r.sv_sum2 for r in results])),
        "sv_sum4": (("prompt", "layer"), np.stack([r.sv_sum4 for r in results])),
    }
    if config.store_factors:
        data["u"] = (
            ("prompt", "layer", "dim", "rank"),
            np.stack([r.u for r in results]).astype(np.float32),
        )
        data["v"] = (
            ("prompt", "layer", "dim", "rank"),
            np.stack([r.v for r in results]).astype(np.float32),
        )
    coords = {
        **prompt_coords,
        "token_position": ("prompt", positions),
        "layer": np.arange(1, n_layers + 1),
        "layer_ref": np.arange(1, n_layers + 1),
        **_k_coords(config),
    }
    ds = xr.Dataset(data, coords=coords, attrs=attrs)
    if config.stored_ks is None:
        ds["depth_diag"].attrs["description"] = (
            "A[a, a] of A = P_j^T J_i Q_j, J_i = J^layer_tt, j = layer_ref"
        )
        ds["depth_corner"].attrs["description"] = "sum_{a,b<k} A[a, b]^2"
    else:
        ds["depth_numerator2"].attrs["description"] = NUMERATOR2_DESCRIPTION
    ds["depth_ucorner"].attrs["description"] = "sum_{a,b<k} (U_i^T U_j)[a, b]^2"
    ds["depth_vcorner"].attrs["description"] = "sum_{a,b<k} (V_i^T V_j)[a, b]^2"
    ds["sv_sum2"].attrs["description"] = "sum of s^2 over the full spectrum (||J||_F^2)"
    ds["sv_sum4"].attrs["description"] = "sum of s^4 over the full spectrum (||J^T J||_F^2)"
    return ds


def spectra_dataset(
    results: list[DepthResult], prompt_coords: dict[str, Any], attrs: dict[str, Any]
) -> xr.Dataset:
    """Full spectra of the prompts that have one (``ExtractConfig.spectra_prompts``)."""
    keep = [i for i, r in enumerate(results) if r.spectrum is not None]
    coords = {
        name: (value[0], [value[1][i] for i in keep])
        if isinstance(value, tuple)
        else [value[i] for i in keep]
        for name, value in prompt_coords.items()
    }
    if not keep:
        return xr.Dataset(coords=coords, attrs={**attrs, "empty": "spectra_prompts is 0"})
    s = np.stack([results[i].spectrum for i in keep])
    coords.update(layer=np.arange(1, s.shape[1] + 1), rank=np.arange(s.shape[2]))
    ds = xr.Dataset(
        {"singular_values": (("prompt", "layer", "rank"), s)}, coords=coords, attrs=attrs
    )
    ds["singular_values"].attrs["description"] = "full spectrum of J^layer_tt at the depth token"
    return ds


FAMILY_DIMS = {
    "self": ("token", "token_ref"),
    "fixed_in": ("token_in", "token", "token_ref"),
    "fixed_out": ("token_out", "token", "token_ref"),
}


def tokens_dataset(
    results: list[TokenResult],
    items: list[PromptText],
    lengths: list[int],
    layers: list[int],
    config: ExtractConfig,
    attrs: dict[str, Any],
) -> xr.Dataset:
    """The ``tokens`` dataset: ``singular_values (prompt, layer, token_in, token_out, rank)`` and
    ``{family}_diag/_corner (variant, prompt, layer, layer_ref, *FAMILY_DIMS[family], rank|k)``
    (``config.stored_ks``: ``{family}_numerator2 (..., reading, k)`` instead), token dims
    NaN-padded to the longest prompt; empty (attrs only) when there are no results.
    """
    if not results:
        return xr.Dataset(attrs={**attrs, "empty": "no token layers or token prompts configured"})
    n_max = max(lengths[: len(results)])
    s = pad([np.stack([r.s[layer] for layer in layers]) for r in results], axes=(1, 2))
    data: dict[str, Any] = {
        "singular_values": (("prompt", "layer", "token_in", "token_out", "rank"), s)
    }
    for family, token_dims in FAMILY_DIMS.items():
        stats, bases = [], []
        for r in results:
            pairs = [[r.families[family][(a, b)] for b in layers] for a in layers]
            grid = [
                np.stack([np.stack([pair[pick] for pair in row], axis=1) for row in pairs], axis=1)
                for pick in (0, 1)
            ]  # (variant, layer, layer_ref, *tokens, K) each
            spectra = np.stack([r.s[layer] for layer in layers])  # (layer, token_in, token_out, K)
            stats.append((*grid, _family_spectra(family, spectra)))
            bases.append(
                tuple(
                    np.stack(
                        [np.stack([r.bases[family][(a, b)][i] for b in layers]) for a in layers]
                    )
                    for i in (0, 1)
                )
            )  # (layer, layer_ref, *tokens, K) each
        token_axes = tuple(range(3, 3 + len(token_dims)))
        per_family = _pair_variables(
            family,
            stats,
            bases if config.token_bases else None,
            ("variant", "prompt", "layer", "layer_ref", *token_dims),
            config.stored_ks,
            axis=1,
            pad_axes=token_axes,
        )
        data.update(per_family)
    for stat in ("sv_sum2", "sv_sum4"):
        per_prompt = [np.stack([getattr(r, stat)[layer] for layer in layers]) for r in results]
        data[stat] = (("prompt", "layer", "token_in", "token_out"), pad(per_prompt, axes=(1, 2)))
    tokens = np.arange(n_max)
    coords = {
        "prompt": [p.id for p in items],
        "prompt_source": ("prompt", [p.source for p in items]),
        "n_tokens": ("prompt", lengths[: len(results)]),
        "layer": layers,
        "layer_ref": layers,
        "token": tokens,
        "token_ref": tokens,
        "token_in": tokens,
        "token_out": tokens,
        **_k_coords(config),
    }
    if not config.token_bases:
        attrs = {**attrs, "token_bases": "not stored (ExtractConfig.token_bases false)"}
    return xr.Dataset(data, coords=coords, attrs=attrs)


def trajectory_dataset(
    all_states: list[np.ndarray],
    prompt_coords: dict[str, Any],
    config: ExtractConfig,
    attrs: dict[str, Any],
) -> xr.Dataset:
    """The ``trajectories`` dataset: ``lss``, ``expodistance``, ``spacing_cv (prompt, token)``,
    ``step_norm (prompt, layer, token)`` (NaN at layer 0), ``pca (prompt, layer, token, pc)`` and
    ``pca_explained (prompt, pc)``; ``layer`` is the state index 0..L (0 = input embedding).
    """
    per_prompt = []
    for x in all_states:
        projection, explained = trajectories.pca_projection(x, config.pca_components)
        per_prompt.append(
            (
                trajectories.line_shape_score(x),
                trajectories.expodistance(x),
                trajectories.spacing_cv(x),
                trajectories.step_norms(x),
                projection,
                explained,
            )
        )
    lss, ed, cv = (pad([p[i] for p in per_prompt], axes=(0,)) for i in range(3))
    steps = pad([p[3] for p in per_prompt], axes=(1,))
    pca = pad([p[4] for p in per_prompt], axes=(1,))
    explained = np.stack([p[5] for p in per_prompt])
    n_states = all_states[0].shape[0]
    coords = {
        **prompt_coords,
        "token": np.arange(lss.shape[1]),
        "layer": np.arange(n_states),
        "pc": np.arange(config.pca_components),
    }
    data = {
        "lss": (("prompt", "token"), lss),
        "expodistance": (("prompt", "token"), ed),
        "spacing_cv": (("prompt", "token"), cv),
        "step_norm": (
            ("prompt", "layer", "token"),
            np.concatenate([np.full((len(per_prompt), 1, steps.shape[2]), np.nan), steps], axis=1),
        ),
        "pca": (("prompt", "layer", "token", "pc"), pca),
        "pca_explained": (("prompt", "pc"), explained),
    }
    ds = xr.Dataset(data, coords=coords, attrs=attrs)
    ds["step_norm"].attrs["description"] = "||x^l - x^(l-1)||; NaN at layer 0"
    return ds


# attrs that count something over a file's prompts: summed when shards merge
SUMMED_ATTRS = ("jtt_composed", "jtt_autograd", "jtt_full_sequence")


def _merged_paths(holding: Sequence[xr.Dataset]) -> dict[str, Any]:
    """The shards' ``jtt_methods`` (counts per block and method, summed), ``jtt_refusals`` (in
    shard order) and ``jtt_choice`` (each distinct choice once), as one job writes them.
    """
    merged: dict[str, Any] = {}
    if any("jtt_methods" in ds.attrs for ds in holding):
        methods: dict[str, dict[str, int]] = {}
        for ds in (ds for ds in holding if "jtt_methods" in ds.attrs):
            for layer, counts in json.loads(ds.attrs["jtt_methods"]).items():
                block = methods.setdefault(layer, {})
                for method, n in counts.items():
                    block[method] = block.get(method, 0) + n
        ordered = {
            layer: dict(sorted(methods[layer].items())) for layer in sorted(methods, key=int)
        }
        merged["jtt_methods"] = json.dumps(ordered)
    if any("jtt_refusals" in ds.attrs for ds in holding):
        refusals = [r for ds in holding for r in json.loads(ds.attrs.get("jtt_refusals", "[]"))]
        merged["jtt_refusals"] = json.dumps(refusals)
    choices = [ds.attrs["jtt_choice"] for ds in holding if "jtt_choice" in ds.attrs]
    if choices:
        merged["jtt_choice"] = "; ".join(dict.fromkeys(choices))
    return merged


def merge_shards(shards: Sequence[xr.Dataset]) -> xr.Dataset:
    """One dataset from the same kind of dataset of consecutive prompt shards, equal to what one
    job over every prompt writes: concatenated along ``prompt`` (NaN-padding token dims to the
    longest prompt, as ``pad`` does); shards without that kind of data (token families and
    spectra live on the first prompts only) are skipped.
    """
    if not shards:
        raise ValueError("no shards to merge")
    holding = [ds for ds in shards if ds.data_vars and ds.sizes.get("prompt", 0) > 0]
    if not holding:
        return shards[0]
    merged = xr.concat(holding, dim="prompt", join="outer", combine_attrs="override")
    # the J_tt record counts the depth Jacobians of a shard's prompts, whichever kind of data the
    # file holds (token families live on the first prompts only): summed over every shard that
    # records it (a shard without Jacobian prompts records none)
    recorded = [ds for ds in shards if any(key in ds.attrs for key in SUMMED_ATTRS)]
    for key in SUMMED_ATTRS:
        if any(key in ds.attrs for ds in recorded):
            merged.attrs[key] = sum(int(ds.attrs[key]) for ds in recorded if key in ds.attrs)
    merged.attrs.update(_merged_paths(recorded))
    for name, variable in holding[0].variables.items():  # padding must not change dtypes
        if name in merged.variables and merged[name].dtype != variable.dtype:
            if np.issubdtype(variable.dtype, np.integer) and not merged[name].isnull().any():
                merged[name] = merged[name].astype(variable.dtype)
    return merged
