"""Heatmaps of m_K: layer x layer (depth-wise) and token x token (token families), on one shared
colour scale per figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize

from blockcoupling.figures.common import MIS_LABEL, no_data, save, style, wrap_name
from blockcoupling.figures.quotes import add_claims_note
from blockcoupling.stats.core import select

HEATMAP_CMAP = "viridis"


def heatmap_grid(
    panels: list[list[tuple[str, pd.DataFrame]]],
    row_labels: Sequence[str],
    axis_labels: tuple[str, str],
    cbar_label: str,
    path: str | Path,
    title: str = "",
    annotate: Callable[[plt.Figure], None] | None = None,
) -> list[Path]:
    """Grid of heatmaps (rows x cols of (title, frame index=y, columns=x)) on one shared colour
    scale; ``annotate`` adds to the figure before it is saved (a claims note).
    """
    values = np.concatenate(
        [np.empty(0)] + [f.to_numpy(dtype=float).ravel() for row in panels for _, f in row]
    )
    finite = values[np.isfinite(values)]
    norm = Normalize(*(np.min(finite), np.max(finite)) if finite.size else (0, 1))
    n_rows, n_cols = len(panels), max(len(row) for row in panels)
    with style():
        fig, axes = plt.subplots(
            n_rows,
            n_cols,
            figsize=(2.8 * n_cols + 1.5, 2.9 * n_rows + 0.5),
            squeeze=False,
            layout="constrained",
        )
        fig.get_layout_engine().set(h_pad=0.08, hspace=0.04)  # a row's ticks clear the next titles
        for r, row in enumerate(panels):
            for c in range(n_cols):
                ax = axes[r, c]
                if c >= len(row):  # a wrapped row's end: no panel, not an empty frame
                    ax.remove()
                    continue
                panel_title, frame = row[c]
                if frame.size == 0 or not np.isfinite(frame.to_numpy(dtype=float)).any():
                    no_data(ax)
                else:
                    draw_heatmap(ax, frame, norm)
                ax.set_title(wrap_name(panel_title, 22), fontsize="small")
                ax.set_xlabel(axis_labels[1] if r == n_rows - 1 else "")
                ax.set_ylabel(f"{row_labels[r]}\n{axis_labels[0]}" if c == 0 else "")
        fig.colorbar(
            ScalarMappable(norm=norm, cmap=HEATMAP_CMAP),
            ax=[ax for ax in axes.flat if ax.figure is not None],
            label=cbar_label,
            shrink=0.8,
        )
        if title:
            fig.suptitle(title)
        if annotate is not None:
            annotate(fig)
        return save(fig, path)


def draw_heatmap(ax: plt.Axes, frame: pd.DataFrame, norm: Normalize, max_ticks: int = 8) -> None:
    """Imshow of `frame` (rows top to bottom = index) with at most `max_ticks` labelled ticks per
    axis.

    (seaborn.heatmap redraws the whole figure per call to thin its tick labels: too slow for grids.)
    """
    ax.imshow(frame.to_numpy(dtype=float), cmap=HEATMAP_CMAP, norm=norm, interpolation="nearest")
    for set_ticks, labels in ((ax.set_xticks, frame.columns), (ax.set_yticks, frame.index)):
        idx = np.unique(
            np.linspace(0, len(labels) - 1, min(len(labels), max_ticks)).round().astype(int)
        )
        set_ticks(idx, [str(labels[i]) for i in idx])
    ax.grid(False)


def matrix(da: xr.DataArray, y: str, x: str) -> pd.DataFrame:
    """2-D frame (index = y coord, columns = x coord) with all-NaN rows and columns dropped."""
    da = da.transpose(y, x).dropna(y, how="all").dropna(x, how="all")
    return pd.DataFrame(da.values, index=da[y].values, columns=da[x].values)


def init_order(da: xr.DataArray) -> list[str]:
    """Init labels in display order: trained first, then random, then any others."""
    values = [str(v) for v in da["init"].values]
    return sorted(values, key=lambda v: {"trained": 0, "random": 1}.get(v, 2))


def depth_heatmaps(depth_mis: xr.DataArray, path: str | Path, max_cols: int = 8) -> list[Path]:
    """Layer x layer_ref m_K, mean over prompts; rows = init, cols = model, shared colour scale;
    the title states K (and the reading) where the selection left them as scalar coordinates.

    `depth_mis`: dims (model, init, prompt, layer, layer_ref), selected at one
    k/reading/variant/norm.
    More than `max_cols` models wrap into further (trained, random) row blocks. A random-init
    twin that several models share (the same matrix: a training grid's runs from one
    initialization) is drawn once, titled with how many models share it.
    """
    require_dims(depth_mis, ("model", "init", "prompt", "layer", "layer_ref"))
    mean = depth_mis.mean("prompt", skipna=True)
    inits = init_order(mean)
    models = [str(m) for m in mean["model"].values]
    frames = {
        (m, i): matrix(mean.sel(model=m, init=i), "layer", "layer_ref")
        for m in models
        for i in inits
    }
    shown = {(m, i): True for m in models for i in inits}
    for i in inits:
        if i == "trained":
            continue
        for a, model in enumerate(models):
            if not shown[(model, i)]:
                continue
            same = [m for m in models[a + 1 :] if _equal(frames[(model, i)], frames[(m, i)])]
            for m in same:
                shown[(m, i)] = False
            if same:
                frames[(model, i)].attrs["shared"] = len(same) + 1
    chunks = [models[i : i + max_cols] for i in range(0, len(models), max_cols)]
    panels, row_labels = [], []
    for chunk in chunks:
        for i in inits:
            row = [
                (_panel_title(m, frames[(m, i)]), frames[(m, i)]) for m in chunk if shown[(m, i)]
            ]
            if row:
                panels.append(row)
                row_labels.append(i)
    return heatmap_grid(
        panels, row_labels, ("block l", "reference block l'"), MIS_LABEL, path, _selection(mean)
    )


def _equal(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether two heatmap frames hold the same matrix (NaN where the other has NaN)."""
    return a.shape == b.shape and bool(
        np.array_equal(a.to_numpy(dtype=float), b.to_numpy(dtype=float), equal_nan=True)
    )


def _panel_title(model: str, frame: pd.DataFrame) -> str:
    """A panel's title: the model, and how many models share the matrix where several do."""
    shared = frame.attrs.get("shared")
    return f"{model} (shared by {shared} models)" if shared else model


def _selection(da: xr.DataArray) -> str:
    """'m_K at K = 4 (reading authors, norm p)' from the scalar coordinates a selection left."""
    scalars = {name: da[name].item() for name in ("k", "reading", "norm") if name in da.coords}
    scalars = {k: v for k, v in scalars.items() if da[k].ndim == 0}
    if "k" not in scalars:
        return ""
    rest = ", ".join(f"{name} {scalars[name]}" for name in ("reading", "norm") if name in scalars)
    return f"$m_K$ at K = {scalars['k']}" + (f" ({rest})" if rest else "")


def require_dims(da: xr.DataArray, dims: Sequence[str]) -> None:
    """Raise if `da` lacks one of `dims`."""
    missing = [d for d in dims if d not in da.dims]
    if missing:
        raise ValueError(f"{da.name or 'data'} lacks dims {missing} (has {list(da.dims)})")


TOKEN_FAMILIES = {
    "self_mis": ("self", None),
    "fixed_in_mis": ("fixed input t1", "token_in"),
    "fixed_out_mis": ("fixed output t2", "token_out"),
}


def token_heatmaps(
    coupling: xr.Dataset,
    path: str | Path,
    model: str,
    layer: int | None = None,
    layer_ref: int | None = None,
    k: int = 10,
    reading: str = "authors",
    variant: str = "ujv",
    norm: str = "p",
    fixed_token: int | None = None,
    claims: pd.DataFrame | None = None,
) -> list[Path]:
    """Token x token_ref m_K (mean over prompts) for self, fixed-input, fixed-output coupling.

    Rows = init, cols = family, for one model and block pair (layer, layer_ref; default: the first
    layer with data, layer_ref = layer). Fixed families: averaged over the fixed token (NaN-aware)
    when `fixed_token` is None, else at that fixed token position. Under the grid: the token
    claims' rows of ``claims`` (``quotes.add_claims_note``), with K.
    """
    present = [v for v in TOKEN_FAMILIES if v in coupling]
    if not present:
        raise ValueError(f"dataset has none of {list(TOKEN_FAMILIES)}")
    ds = select(coupling[present], model=model, k=k, reading=reading, variant=variant, norm=norm)
    layer = _first_finite_layer(ds[present[0]]) if layer is None else layer
    ds = select(ds, layer=layer, layer_ref=layer if layer_ref is None else layer_ref)
    inits = init_order(ds)
    panels = []
    for init in inits:
        row = []
        for var in present:
            name, fixed_dim = TOKEN_FAMILIES[var]
            da = ds[var].sel(init=init).mean("prompt", skipna=True)
            if fixed_dim is not None:
                da, name = _fix_token(da, name, fixed_dim, fixed_token)
            row.append((name, matrix(da, "token", "token_ref")))
        panels.append(row)
    title = (
        f"{model}: block {layer} vs block {layer if layer_ref is None else layer_ref}, "
        "mean over prompts"
    )
    title += f", $m_K$ at K = {k}"
    chance = "not drawn (each pair's m_K beside its chance level: the claims' token-pair excess)"
    return heatmap_grid(
        panels,
        inits,
        ("token t", "reference token t'"),
        MIS_LABEL,
        path,
        title,
        lambda fig: add_claims_note(fig, claims, "token_heatmaps", k, chance),
    )


def _first_finite_layer(da: xr.DataArray) -> int:
    """First `layer` with any finite value (token families are NaN outside their configured
    layers).
    """
    finite = np.isfinite(da).any([d for d in da.dims if d != "layer"])
    if not finite.any():
        raise ValueError(f"{da.name} has no finite values")
    return int(da["layer"].values[finite.values.argmax()])


def _fix_token(
    da: xr.DataArray, name: str, fixed_dim: str, fixed_token: int | None
) -> tuple[xr.DataArray, str]:
    """Average over the fixed-token dim (None) or select one fixed token; returns data and panel
    title.
    """
    if fixed_token is None:
        return da.mean(fixed_dim, skipna=True), f"{name}: mean"
    return select(da, **{fixed_dim: fixed_token}), f"{name} = {fixed_token}"
