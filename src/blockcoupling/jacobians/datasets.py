"""The xarray datasets that ``measure`` returns (docs/datasets.md), built from per-prompt results.

Torch-free: extraction (``jacobians.extract``) hands numpy arrays over in ``DepthResult`` and
``TokenResult``; every function here only lays them out with named dims and coords.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

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


def depth_dataset(
    results: list[DepthResult],
    prompt_coords: dict[str, Any],
    positions: list[int],
    config: ExtractConfig,
    attrs: dict[str, Any],
) -> xr.Dataset:
    """The ``depth`` dataset: ``singular_values (prompt, layer, rank)``, ``depth_diag`` and
    ``depth_corner (variant, prompt, layer, layer_ref, rank|k)``, and
    ``u, v (prompt, layer, dim, rank)`` when ``config.store_factors``; coord ``token_position``.
    """
    n_layers = results[0].s.shape[0]
    k = config.k_max
    dims_pair = ("variant", "prompt", "layer", "layer_ref")
    data = {
        "singular_values": (("prompt", "layer", "rank"), np.stack([r.s[:, :k] for r in results])),
        "depth_diag": ((*dims_pair, "rank"), np.stack([r.diag for r in results], axis=1)),
        "depth_corner": ((*dims_pair, "k"), np.stack([r.corner for r in results], axis=1)),
        "depth_ucorner": (
            ("prompt", "layer", "layer_ref", "k"),
            np.stack([r.ucorner for r in results]),
        ),
        "depth_vcorner": (
            ("prompt", "layer", "layer_ref", "k"),
            np.stack([r.vcorner for r in results]),
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
        "rank": np.arange(k),
        "k": np.arange(1, k + 1),
        "variant": list(config.variants),
    }
    ds = xr.Dataset(data, coords=coords, attrs=attrs)
    ds["depth_diag"].attrs["description"] = (
        "A[a, a] of A = P_j^T J_i Q_j, J_i = J^layer_tt, j = layer_ref"
    )
    ds["depth_corner"].attrs["description"] = "sum_{a,b<k} A[a, b]^2"
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
    ``{family}_diag/_corner (variant, prompt, layer, layer_ref, *FAMILY_DIMS[family], rank|k)``,
    token dims NaN-padded to the longest prompt; empty (attrs only) when there are no results.
    """
    if not results:
        return xr.Dataset(attrs={**attrs, "empty": "no token layers or token prompts configured"})
    k = config.k_max
    n_max = max(lengths[: len(results)])
    s = pad([np.stack([r.s[layer] for layer in layers]) for r in results], axes=(1, 2))
    data: dict[str, Any] = {
        "singular_values": (("prompt", "layer", "token_in", "token_out", "rank"), s)
    }
    for family, token_dims in FAMILY_DIMS.items():
        for stat, last in (("diag", "rank"), ("corner", "k")):
            per_prompt = []
            for r in results:
                pick = 0 if stat == "diag" else 1
                grid = np.stack(
                    [
                        np.stack([r.families[family][(a, b)][pick] for b in layers], axis=1)
                        for a in layers
                    ],
                    axis=1,
                )
                per_prompt.append(grid)  # (variant, layer, layer_ref, *tokens, K)
            axes = tuple(range(3, 3 + len(token_dims)))
            stacked = pad(per_prompt, axes)  # (prompt, variant, layer, layer_ref, *tokens, K)
            stacked = np.moveaxis(stacked, 1, 0)
            data[f"{family}_{stat}"] = (
                ("variant", "prompt", "layer", "layer_ref", *token_dims, last),
                stacked,
            )
    for family, token_dims in FAMILY_DIMS.items():
        for pick, stat in enumerate(("ucorner", "vcorner")):
            per_prompt = [
                np.stack(
                    [np.stack([r.bases[family][(a, b)][pick] for b in layers]) for a in layers]
                )
                for r in results
            ]  # (layer, layer_ref, *tokens, K)
            data[f"{family}_{stat}"] = (
                ("prompt", "layer", "layer_ref", *token_dims, "k"),
                pad(per_prompt, tuple(range(2, 2 + len(token_dims)))),
            )
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
        "rank": np.arange(k),
        "k": np.arange(1, k + 1),
        "variant": list(config.variants),
    }
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
SUMMED_ATTRS = ("jtt_composed", "jtt_autograd")


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
    for key in SUMMED_ATTRS:  # counts over the prompts of each shard
        if all(key in ds.attrs for ds in holding):
            merged.attrs[key] = sum(int(ds.attrs[key]) for ds in holding)
    for name, variable in holding[0].variables.items():  # padding must not change dtypes
        if name in merged.variables and merged[name].dtype != variable.dtype:
            if np.issubdtype(variable.dtype, np.integer) and not merged[name].isnull().any():
                merged[name] = merged[name].astype(variable.dtype)
    return merged
