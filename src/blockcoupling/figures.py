"""Figures (seaborn/matplotlib, Agg backend) from the combined datasets and the `stats` tables.

Every public function takes its data, a path (a stem, or a .png/.pdf path), and options; it writes a
PNG (dpi 150) and a PDF side by side and returns their paths. Missing values (NaN) are dropped per
panel; a fit or correlation is replaced by "n too small" in the title when there are too few points.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import xarray as xr
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize

from blockcoupling.io import read_netcdf
from blockcoupling.stats.core import correlate, mixed_slope, require_columns, select

matplotlib.use("Agg")

DPI = 150
MIN_N_FIT = 3
HEATMAP_CMAP = "viridis"
MIS_LABEL = "mis-coupling m_K (lower = more coupled)"
STEP_LABEL = "training step (symlog axis; 0 = initialization)"
LABELS = {
    "coupling": "coupling (−mean m_K over l≠l')",
    "adjacent_coupling": "adjacent-layer coupling (−mean m_K, |l−l'|=1)",
    "score": "Open LLM Leaderboard average score",
    "neg_bits_per_byte": "−bits per byte on held-out text (higher = better)",
    "mc_accuracy": "multiple-choice accuracy",
    "log10_params": "log10 parameters",
    "n_layers": "depth (blocks)",
    "d_model": "width (hidden size)",
    "log10_train_tokens": "log10 training tokens",
    "val_loss": "validation loss (cross-entropy, nats/token)",
    "neg_val_loss": "−validation loss (nats/token)",
    "lss": "line-shape score LSS (1 = straight)",
    "expodistance": "expodistance (CV of step-norm ratios)",
}
SHORT_LABELS = {
    "coupling": "coupling",
    "log10_params": "log10 params",
    "n_layers": "depth",
    "d_model": "width",
    "log10_train_tokens": "log10 tokens",
}


# The figures: name -> (report category, input file, options it takes). A literal, so the workflow
# reads it without importing matplotlib (workflow.figure_registry); a rule per entry calls `render`.
# A figure is made when its input file is one of the config's outputs. Adding one: its function
# (named as the figure, taking (data, path) or an adapter in `render`), a line here, and its
# caption report/<name>.rst.
FIGURES = {
    "coupling_vs_score": ("cross-model", "results/stats/summary.csv", ()),
    "hyperparameter_correlations": ("cross-model", "results/stats/correlations.csv", ()),
    "depth_heatmaps": ("cross-model", "results/combined/coupling.nc", ("selection",)),
    "token_heatmaps": (
        "cross-model",
        "results/combined/tokens.nc",
        ("selection", "token_model"),
    ),
    "lss_expodistance": ("cross-model", "results/combined/trajectories.nc", ()),
    "pca_trajectories": ("cross-model", "results/combined/trajectories.nc", ("token_model",)),
    "singular_value_spectra": ("cross-model", "results/combined/spectra.nc", ("token_model",)),
    "k_sweep_curve": ("cross-model", "results/stats/k_sweep.csv", ()),
    "coupling_vs_step": ("training emergence", "results/stats/checkpoint_table.csv", ()),
    "depth_heatmaps_over_training": (
        "training emergence",
        "results/combined/checkpoints/coupling.nc",
        ("selection",),
    ),
    "trajectory_metrics_vs_step": (
        "training emergence",
        "results/stats/checkpoint_table.csv",
        (),
    ),
    "coupling_vs_validation_loss": (
        "training emergence",
        "results/stats/checkpoint_table.csv",
        (),
    ),
    "vit_coupling_vs_sd": ("ViT sweep", "results/stats/vit_coupling_vs_sd.csv", ()),
    "vit_coupling_vs_accuracy": ("ViT sweep", "results/stats/vit_models.csv", ()),
}


# --------------------------------------------------------------------------- style and saving
@contextmanager
def style() -> Iterator[None]:
    """The one figure style: seaborn whitegrid, paper context, dpi 150."""
    rc = {"savefig.dpi": DPI, "axes.titlesize": "medium", "legend.fontsize": "small"}
    with (
        sns.axes_style("whitegrid"),
        sns.plotting_context("paper", font_scale=1.1),
        matplotlib.rc_context(rc),
    ):
        yield


def save(fig: plt.Figure, path: str | Path) -> list[Path]:
    """Save `fig` as `{stem}.png` (dpi 150) and `{stem}.pdf`; `path` is a stem or a .png/.pdf
    path.
    """
    path = Path(path)
    stem = path.with_suffix("") if path.suffix.lower() in (".png", ".pdf") else path
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_name(f"{stem.name}.png"), stem.with_name(f"{stem.name}.pdf")]
    fig.set_dpi(DPI)
    bbox = fig.get_tightbbox(fig.canvas.get_renderer()).padded(
        matplotlib.rcParams["savefig.pad_inches"]
    )
    for out in paths:
        fig.savefig(
            out, dpi=DPI, bbox_inches=bbox
        )  # one tight box for both: "tight" redraws per file
    plt.close(fig)
    return paths


@contextmanager
def _seeded_numpy(seed: int) -> Iterator[None]:
    """Numpy's global generator seeded for the duration (restored afterwards)."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _label(column: str) -> str:
    """Axis label with units for a table column (the column name if unknown)."""
    return LABELS.get(column, column)


def _no_data(ax: plt.Axes, text: str = "no data") -> None:
    """Mark an empty panel."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _corr_text(x: Sequence[float], y: Sequence[float], method: str = "pearson") -> str:
    """'Pearson r = .. [lo, hi], p = .., n = ..' or 'n too small (n=..)' when r is undefined."""
    res = correlate(x, y, method)
    if np.isnan(res["r"]):
        return (
            f"n too small (n={res['n']})"
            if res["n"] < 4
            else f"r undefined ({res['reason']}, n={res['n']})"
        )
    return (
        f"{method.capitalize()} r = {res['r']:.2f} [{res['ci_low']:.2f}, {res['ci_high']:.2f}], "
        f"p = {res['p']:.2g}, n = {res['n']}"
    )


def _score_column_label(table: pd.DataFrame, column: str) -> str:
    """Label of the score column, named by `score_name` when the table has one."""
    if column == "score" and "score_name" in table.columns and table["score_name"].notna().any():
        return _label(str(table["score_name"].dropna().iloc[0]))
    return _label(column)


# --------------------------------------------------------------------------- heatmap grid
def _heatmap_grid(
    panels: list[list[tuple[str, pd.DataFrame]]],
    row_labels: Sequence[str],
    axis_labels: tuple[str, str],
    cbar_label: str,
    path: str | Path,
    title: str = "",
) -> list[Path]:
    """Grid of heatmaps (rows x cols of (title, frame index=y, columns=x)) on one shared colour
    scale.
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
            figsize=(2.8 * n_cols + 1.5, 2.8 * n_rows + 0.5),
            squeeze=False,
            gridspec_kw={"wspace": 0.25, "hspace": 0.35},
        )
        for r, row in enumerate(panels):
            for c in range(n_cols):
                ax = axes[r, c]
                if c >= len(row):
                    ax.axis("off")
                    continue
                panel_title, frame = row[c]
                if frame.size == 0 or not np.isfinite(frame.to_numpy(dtype=float)).any():
                    _no_data(ax)
                else:
                    _draw_heatmap(ax, frame, norm)
                ax.set_title(panel_title)
                ax.set_xlabel(axis_labels[1] if r == n_rows - 1 else "")
                ax.set_ylabel(f"{row_labels[r]}\n{axis_labels[0]}" if c == 0 else "")
        fig.colorbar(
            ScalarMappable(norm=norm, cmap=HEATMAP_CMAP), ax=axes, label=cbar_label, shrink=0.8
        )
        if title:
            fig.suptitle(title)
        return save(fig, path)


def _draw_heatmap(ax: plt.Axes, frame: pd.DataFrame, norm: Normalize, max_ticks: int = 8) -> None:
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


def _matrix(da: xr.DataArray, y: str, x: str) -> pd.DataFrame:
    """2-D frame (index = y coord, columns = x coord) with all-NaN rows and columns dropped."""
    da = da.transpose(y, x).dropna(y, how="all").dropna(x, how="all")
    return pd.DataFrame(da.values, index=da[y].values, columns=da[x].values)


def _inits(da: xr.DataArray) -> list[str]:
    """Init labels in display order: trained first, then random, then any others."""
    values = [str(v) for v in da["init"].values]
    return sorted(values, key=lambda v: {"trained": 0, "random": 1}.get(v, 2))


# --------------------------------------------------------------------------- 1. coupling vs score
def coupling_vs_score(
    table: pd.DataFrame, path: str | Path, x: str = "coupling", y: str = "score"
) -> list[Path]:
    """Scatter of `x` vs `y` across models (a `model_table`), OLS line + 95% CI band, model labels.

    Horizontal bars: the bootstrap CI over prompts (`{x}_low`, `{x}_high`) when present.
    """
    data = table.dropna(subset=[x, y])
    with style():
        fig, ax = plt.subplots(figsize=(6.5, 4.8))
        if len(data) >= MIN_N_FIT:
            sns.regplot(
                data=data,
                x=x,
                y=y,
                ax=ax,
                scatter=False,
                ci=95,
                seed=0,
                color="0.3",
                line_kws={"lw": 1},
            )
        if {f"{x}_low", f"{x}_high"} <= set(data.columns):
            err = np.abs(np.vstack([data[x] - data[f"{x}_low"], data[f"{x}_high"] - data[x]]))
            ax.errorbar(data[x], data[y], xerr=err, fmt="none", ecolor="0.7", lw=0.8, zorder=1)
        hue = (
            data["base"].map({True: "base", False: "fine-tuned"})
            if "base" in data.columns
            else None
        )
        sns.scatterplot(data=data, x=x, y=y, hue=hue, ax=ax, zorder=2)
        if ax.get_legend() is not None:
            ax.get_legend().set_title("model type")
        for _, row in data.iterrows():
            ax.annotate(
                str(row["model"]),
                (row[x], row[y]),
                xytext=(3, 3),
                textcoords="offset points",
                fontsize=6,
            )
        if data.empty:
            _no_data(ax)
        fit = "" if len(data) >= MIN_N_FIT else " (no fit)"
        ax.set(
            xlabel=_label(x),
            ylabel=_score_column_label(table, y),
            title=_corr_text(data[x], data[y]) + fit,
        )
        return save(fig, path)


# --------------------------------------------------------------------------- 2. predictor bars
def hyperparameter_correlations(corr: pd.DataFrame, path: str | Path) -> list[Path]:
    """Bars of r (with CI error bars) per predictor, hue = method, one panel per subset.

    `corr`: a `stats.correlations` table. Missing r (n too small) is marked "n/a".
    """
    subsets = list(dict.fromkeys(corr["subset"]))
    predictors = list(dict.fromkeys(corr["predictor"]))
    methods = list(dict.fromkeys(corr["method"]))
    width = 0.8 / max(len(methods), 1)
    colors = sns.color_palette(n_colors=max(len(methods), 1))
    with style():
        fig, axes = plt.subplots(
            1,
            max(len(subsets), 1),
            figsize=(1.3 * len(predictors) * len(subsets) + 2, 4),
            sharey=True,
            squeeze=False,
        )
        for ax, subset in zip(axes[0], subsets):
            part = corr[corr["subset"] == subset].set_index(["predictor", "method"])
            for i, method in enumerate(methods):
                rows = part.reindex([(p, method) for p in predictors])
                pos = np.arange(len(predictors)) - 0.4 + width * (i + 0.5)
                r = rows["r"].to_numpy(dtype=float)
                err = np.abs(np.vstack([r - rows["ci_low"], rows["ci_high"] - r]))
                ax.bar(
                    pos, np.nan_to_num(r), width, yerr=err, capsize=3, color=colors[i], label=method
                )
                for p in pos[np.isnan(r)]:
                    ax.text(p, 0, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
            n = int(part["n"].max()) if len(part) else 0
            ax.axhline(0, color="0.3", lw=0.8)
            ax.set_xticks(
                np.arange(len(predictors)),
                [SHORT_LABELS.get(p, p) for p in predictors],
                rotation=30,
                ha="right",
            )
            ax.set(title=f"{subset} models (n ≤ {n})", ylim=(-1.05, 1.05))
        target = str(corr["target"].iloc[0]) if len(corr) else "score"
        axes[0, 0].set_ylabel(f"correlation with {target} (r, 95% CI)")
        axes[0, 0].legend(title="method")
        return save(fig, path)


# --------------------------------------------------------------------------- 3. depth heatmaps
def depth_heatmaps(depth_mis: xr.DataArray, path: str | Path, max_cols: int = 8) -> list[Path]:
    """Layer x layer_ref m_K, mean over prompts; rows = init, cols = model, shared colour scale.

    `depth_mis`: dims (model, init, prompt, layer, layer_ref), selected at one
    k/reading/variant/norm.
    More than `max_cols` models wrap into further (trained, random) row blocks.
    """
    _require_dims(depth_mis, ("model", "init", "prompt", "layer", "layer_ref"))
    mean = depth_mis.mean("prompt", skipna=True)
    inits = _inits(mean)
    models = [str(m) for m in mean["model"].values]
    chunks = [models[i : i + max_cols] for i in range(0, len(models), max_cols)]
    panels = [
        [(m, _matrix(mean.sel(model=m, init=i), "layer", "layer_ref")) for m in chunk]
        for chunk in chunks
        for i in inits
    ]
    row_labels = [i for _ in chunks for i in inits]
    return _heatmap_grid(panels, row_labels, ("block l", "reference block l'"), MIS_LABEL, path)


def _require_dims(da: xr.DataArray, dims: Sequence[str]) -> None:
    """Raise if `da` lacks one of `dims`."""
    missing = [d for d in dims if d not in da.dims]
    if missing:
        raise ValueError(f"{da.name or 'data'} lacks dims {missing} (has {list(da.dims)})")


# --------------------------------------------------------------------------- 4. token heatmaps
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
) -> list[Path]:
    """Token x token_ref m_K (mean over prompts) for self, fixed-input, fixed-output coupling.

    Rows = init, cols = family, for one model and block pair (layer, layer_ref; default: the first
    layer with data, layer_ref = layer). Fixed families: averaged over the fixed token (NaN-aware)
    when `fixed_token` is None, else at that fixed token position.
    """
    present = [v for v in TOKEN_FAMILIES if v in coupling]
    if not present:
        raise ValueError(f"dataset has none of {list(TOKEN_FAMILIES)}")
    ds = select(coupling[present], model=model, k=k, reading=reading, variant=variant, norm=norm)
    layer = _first_finite_layer(ds[present[0]]) if layer is None else layer
    ds = select(ds, layer=layer, layer_ref=layer if layer_ref is None else layer_ref)
    inits = _inits(ds)
    panels = []
    for init in inits:
        row = []
        for var in present:
            name, fixed_dim = TOKEN_FAMILIES[var]
            da = ds[var].sel(init=init).mean("prompt", skipna=True)
            if fixed_dim is not None:
                da, name = _fix_token(da, name, fixed_dim, fixed_token)
            row.append((name, _matrix(da, "token", "token_ref")))
        panels.append(row)
    title = (
        f"{model}: block {layer} vs block {layer if layer_ref is None else layer_ref}, "
        "mean over prompts"
    )
    return _heatmap_grid(panels, inits, ("token t", "reference token t'"), MIS_LABEL, path, title)


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


# --------------------------------------------------------------------------- 5. LSS / expodistance
def lss_expodistance(trajectories: xr.Dataset, path: str | Path) -> list[Path]:
    """Box + strip plots of per-prompt LSS and expodistance (mean over tokens) per model,
    hue = init.

    `trajectories`: lss, expodistance with dims (model, init, prompt, token).
    """
    metrics = ["lss", "expodistance"]
    frame = (
        trajectories[metrics]
        .mean("token", skipna=True)
        .to_dataframe()[metrics]
        .reset_index()
        .melt(id_vars=["model", "init", "prompt"], var_name="metric")
        .dropna(subset=["value"])
    )
    order = [str(m) for m in trajectories["model"].values]
    with style():
        fig, axes = plt.subplots(
            2, 1, figsize=(max(5, 0.7 * len(order) + 2), 7), sharex=True, squeeze=False
        )
        for ax, metric in zip(axes[:, 0], metrics):
            part = frame[frame["metric"] == metric]
            if part.empty:
                _no_data(ax)
            else:
                sns.boxplot(
                    data=part,
                    x="model",
                    y="value",
                    hue="init",
                    order=order,
                    showfliers=False,
                    ax=ax,
                )
                with _seeded_numpy(0):  # seaborn jitters with numpy's global generator
                    sns.stripplot(
                        data=part,
                        x="model",
                        y="value",
                        hue="init",
                        order=order,
                        dodge=True,
                        size=2,
                        alpha=0.5,
                        palette=dict.fromkeys(part["init"].unique(), "0.2"),
                        legend=False,
                        ax=ax,
                    )
            if metric != metrics[0] and ax.get_legend() is not None:
                ax.get_legend().remove()
            ax.set(ylabel=_label(metric), xlabel="")
        axes[-1, 0].tick_params(axis="x", rotation=45)
        axes[-1, 0].set_xlabel("model (one point per prompt: mean over tokens)")
        return save(fig, path)


# --------------------------------------------------------------------------- 6. PCA trajectories
def pca_trajectories(
    trajectories: xr.Dataset, path: str | Path, model: str, prompt: str | None = None
) -> list[Path]:
    """Per-token polylines through layers 0..L in the 2-PC plane, markers coloured by depth.

    `trajectories.pca`: dims (model, init, prompt, layer, token, pc); one panel per init (each with
    its own PCA fit). `prompt` defaults to the first prompt.
    """
    da = select(trajectories["pca"], model=model)
    prompt = str(da["prompt"].values[0]) if prompt is None else prompt
    da = select(da, prompt=prompt)
    inits = _inits(da)
    layers = da["layer"].values
    norm = Normalize(float(np.min(layers)), float(np.max(layers)))
    with style():
        fig, axes = plt.subplots(1, len(inits), figsize=(4.5 * len(inits) + 1, 4.2), squeeze=False)
        for ax, init in zip(axes[0], inits):
            xy = da.sel(init=init).transpose("token", "layer", "pc").values
            for line in xy:
                keep = np.isfinite(line).all(axis=1)
                ax.plot(line[keep, 0], line[keep, 1], color="0.75", lw=0.6, zorder=1)
                ax.scatter(
                    line[keep, 0],
                    line[keep, 1],
                    c=layers[keep],
                    cmap="viridis",
                    norm=norm,
                    s=8,
                    zorder=2,
                )
            if not np.isfinite(xy).any():
                _no_data(ax)
            ax.set(
                title=f"{init}",
                xlabel=_pc_label(trajectories, model, init, prompt, 0),
                ylabel=_pc_label(trajectories, model, init, prompt, 1),
            )
        fig.colorbar(
            ScalarMappable(norm=norm, cmap="viridis"),
            ax=axes.ravel().tolist(),
            label="depth (layer; 0 = input embedding)",
        )
        fig.suptitle(f"{model}, prompt {prompt}: one line per token")
        return save(fig, path)


def _pc_label(trajectories: xr.Dataset, model: str, init: str, prompt: str, pc: int) -> str:
    """'PC n (x% of variance)' when `pca_explained` is present (a fraction in [0, 1])."""
    if "pca_explained" not in trajectories:
        return f"PC {pc + 1}"
    share = float(
        select(trajectories["pca_explained"], model=model, init=init, prompt=prompt, pc=pc)
    )
    return f"PC {pc + 1} ({100 * share:.0f}% of variance)" if np.isfinite(share) else f"PC {pc + 1}"


# --------------------------------------------------------------------------- 7. singular values
def singular_value_spectra(spectra: xr.Dataset, path: str | Path, model: str) -> list[Path]:
    """Singular values of J^l_tt vs rank, one line per layer (colour = layer), per init; log y.

    `spectra.singular_values`: dims (model, init, prompt, layer, rank); mean over prompts.
    """
    da = select(spectra["singular_values"], model=model).mean("prompt", skipna=True)
    da = da.where(da > 0)
    inits = _inits(da)
    layers = da["layer"].values
    norm = Normalize(float(np.min(layers)), float(np.max(layers)))
    cmap = plt.get_cmap("viridis")
    with style():
        fig, axes = plt.subplots(
            1, len(inits), figsize=(4.5 * len(inits) + 1, 4), sharey=True, squeeze=False
        )
        for ax, init in zip(axes[0], inits):
            part = da.sel(init=init)
            for layer in layers:
                ax.plot(
                    part["rank"].values, part.sel(layer=layer).values, color=cmap(norm(layer)), lw=1
                )
            if np.isfinite(part.values).any():
                ax.set_yscale("log")
            else:
                _no_data(ax)
            ax.set(title=init, xlabel="rank a (singular index, descending)")
        axes[0, 0].set_ylabel("singular value of J^l (mean over prompts)")
        fig.colorbar(
            ScalarMappable(norm=norm, cmap=cmap), ax=axes.ravel().tolist(), label="block l"
        )
        fig.suptitle(model)
        return save(fig, path)


# --------------------------------------------------------------------------- 8. K sweep
def k_sweep_curve(sweep: pd.DataFrame, path: str | Path) -> list[Path]:
    """Correlation of coupling with the score vs K (95% CI band), hue = method, one panel per
    subset.

    `sweep`: a `stats.k_sweep` table.
    """
    subsets = list(dict.fromkeys(sweep["subset"]))
    with style():
        fig, axes = plt.subplots(
            1, max(len(subsets), 1), figsize=(4.5 * len(subsets) + 1, 4), sharey=True, squeeze=False
        )
        for ax, subset in zip(axes[0], subsets):
            part = sweep[sweep["subset"] == subset].sort_values("k")
            for i, (method, rows) in enumerate(part.groupby("method", sort=False)):
                color = sns.color_palette()[i]
                ax.plot(rows["k"], rows["r"], marker="o", color=color, label=method)
                ax.fill_between(rows["k"], rows["ci_low"], rows["ci_high"], color=color, alpha=0.2)
            n = int(part["n"].max()) if len(part) else 0
            ok = part["r"].notna().any()
            ax.axhline(0, color="0.3", lw=0.8)
            ax.set(
                title=f"{subset} models (n ≤ {n})" + ("" if ok else ": n too small"),
                xlabel="K (top singular vectors in m_K)",
                ylim=(-1.05, 1.05),
            )
        axes[0, 0].set_ylabel("correlation of coupling with score (r, 95% CI)")
        axes[0, 0].legend(title="method")
        return save(fig, path)


# --------------------------------------------------------------------------- 9-12. checkpoints
def _model_order(table: pd.DataFrame) -> list[str]:
    """Model names ordered by size (log10_params; unknown last), then name."""
    models = table["model"].astype(str)
    size = (
        table["log10_params"]
        if "log10_params" in table.columns
        else pd.Series(np.nan, index=table.index)
    )
    order = pd.DataFrame({"model": models, "size": size.fillna(np.inf)}).drop_duplicates("model")
    return list(order.sort_values(["size", "model"])["model"])


def _lines_vs_step(table: pd.DataFrame, columns: Sequence[str], path: str | Path) -> list[Path]:
    """One panel per column: value vs step (symlog x), one line per model (ordered by size),
    with a band where the table has the column's bootstrap CI (``*_low``, ``*_high``).
    """
    require_columns(table, ["model", "step", *columns])
    order = _model_order(table)
    with style():
        fig, axes = plt.subplots(
            1, len(columns), figsize=(4.8 * len(columns) + 1.5, 4), squeeze=False
        )
        for ax, column in zip(axes[0], columns):
            data = table.dropna(subset=[column])
            if data.empty:
                _no_data(ax)
            else:
                palette = dict(zip(order, sns.color_palette(n_colors=len(order))))
                sns.lineplot(
                    data=data,
                    x="step",
                    y=column,
                    hue="model",
                    hue_order=order,
                    palette=palette,
                    marker="o",
                    errorbar=None,
                    ax=ax,
                    legend=ax is axes[0, -1],
                )
                if {f"{column}_low", f"{column}_high"} <= set(data.columns):  # bootstrap CIs
                    for model, rows in data.groupby("model"):
                        ax.fill_between(
                            rows["step"],
                            rows[f"{column}_low"],
                            rows[f"{column}_high"],
                            color=palette[str(model)],
                            alpha=0.15,
                            lw=0,
                        )
            ax.set_xscale("symlog", linthresh=1)
            ax.set_xlim(left=-0.3)
            ax.set(xlabel=STEP_LABEL, ylabel=_label(column))
        if axes[0, -1].get_legend() is not None:
            sns.move_legend(axes[0, -1], "upper left", bbox_to_anchor=(1.02, 1), title="model")
        return save(fig, path)


def coupling_vs_step(table: pd.DataFrame, path: str | Path) -> list[Path]:
    """All-pairs and adjacent-layer coupling vs training step, one line per model (a
    `checkpoint_table`).
    """
    return _lines_vs_step(table, ["coupling", "adjacent_coupling"], path)


def trajectory_metrics_vs_step(table: pd.DataFrame, path: str | Path) -> list[Path]:
    """Mean LSS and expodistance vs training step, one line per model (a `checkpoint_table`)."""
    return _lines_vs_step(table, ["lss", "expodistance"], path)


def pick_steps(steps: Sequence[int]) -> list[int]:
    """Early (first), middle (closest to the midpoint in log(1 + step)) and final step,
    deduplicated.
    """
    steps = np.sort(np.asarray(steps, dtype=int))
    if steps.size == 0:
        return []
    log = np.log1p(steps)
    middle = steps[np.argmin(np.abs(log - (log[0] + log[-1]) / 2))]
    return list(dict.fromkeys(int(s) for s in (steps[0], middle, steps[-1])))


def depth_heatmaps_over_training(
    depth_mis: xr.DataArray, path: str | Path, steps: Sequence[int] | None = None
) -> list[Path]:
    """Layer x layer_ref m_K (mean over prompts) at early/middle/final steps; rows = model.

    `depth_mis`: dims (model, step, prompt, layer, layer_ref). `steps` default: `pick_steps` of the
    steps where each model has data.
    """
    _require_dims(depth_mis, ("model", "step", "prompt", "layer", "layer_ref"))
    mean = depth_mis.mean("prompt", skipna=True)
    models = [str(m) for m in mean["model"].values]
    panels = []
    for model in models:
        part = mean.sel(model=model)
        have = [int(s) for s in part["step"].values if np.isfinite(part.sel(step=s).values).any()]
        chosen = pick_steps(have) if steps is None else list(steps)
        panels.append(
            [
                (f"{model}, step {s}", _matrix(select(part, step=s), "layer", "layer_ref"))
                for s in chosen
            ]
            or [(model, pd.DataFrame())]
        )
    return _heatmap_grid(panels, models, ("block l", "reference block l'"), MIS_LABEL, path)


def coupling_vs_validation_loss(table: pd.DataFrame, path: str | Path) -> list[Path]:
    """Coupling vs validation loss over checkpoints and sizes: colour = log10(step + 1),
    marker = model; the title gives the mixed-model slope with runs as groups.
    """
    require_columns(table, ["model", "step", "coupling", "val_loss"])
    data = table.dropna(subset=["coupling", "val_loss"]).sort_values("step")
    log_step = np.log10(data["step"].to_numpy(dtype=float) + 1)
    norm = Normalize(*(log_step.min(), log_step.max()) if len(data) else (0, 1))
    markers = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
    with style():
        fig, ax = plt.subplots(figsize=(6.5, 4.8))
        for i, model in enumerate(m for m in _model_order(table) if m in set(data["model"])):
            rows = data["model"] == model
            ax.plot(
                data.loc[rows, "val_loss"],
                data.loc[rows, "coupling"],
                color="0.8",
                lw=0.6,
                zorder=1,
            )
            ax.scatter(
                data.loc[rows, "val_loss"],
                data.loc[rows, "coupling"],
                c=log_step[rows.to_numpy()],
                cmap="viridis",
                norm=norm,
                marker=markers[i % len(markers)],
                edgecolor="0.2",
                lw=0.3,
                label=model,
                zorder=2,
            )
        if data.empty:
            _no_data(ax)
        else:
            for handle in ax.legend(title="model", loc="best").legend_handles:
                handle.set_facecolor("0.6")
        fig.colorbar(ScalarMappable(norm=norm, cmap="viridis"), ax=ax, label="log10(step + 1)")
        ax.set(
            xlabel=_label("val_loss"),
            ylabel=_label("coupling"),
            title="coupling vs −validation loss\n" + _mixed_text(data, "neg_val_loss", "coupling"),
        )
        return save(fig, path)


def _mixed_text(data: pd.DataFrame, target: str, predictor: str) -> str:
    """The mixed-model slope (run as group) of ``target`` on ``predictor``, or why there is
    none: checkpoints of one run are repeated measures, not independent points.
    """
    res = mixed_slope(data.assign(neg_val_loss=-data["val_loss"]), target, predictor, "model")
    if np.isnan(res["coef"]):
        return f"mixed model: {res['reason']}"
    model = (
        "OLS, run-clustered SEs" if "clustered" in res["reason"] else "mixed model, run as group"
    )
    return (
        f"{model}: −val loss {res['coef']:+.3f} nats per sd of coupling "
        f"[{res['ci_low']:+.3f}, {res['ci_high']:+.3f}], p = {res['p']:.2g}, "
        f"n = {res['n']} in {res['n_groups']} runs"
    )


# --------------------------------------------------------------------------- 13-14. ViT sweep
def vit_coupling_vs_sd(by_rate: pd.DataFrame, path: str | Path) -> list[Path]:
    """Coupling vs stochastic-depth rate: one line per weight decay (thin, coloured) and the
    mean over weight decays (black), each with its 95% CI (seeds and images resampled).

    `by_rate`: a `stats.vit_coupling_by_rate` table (wd = "all" for the pooled rows).
    """
    require_columns(by_rate, ["sd", "wd", "coupling", "ci_low", "ci_high"])
    data = by_rate.assign(wd=by_rate["wd"].astype(str)).sort_values("sd")
    decays = [w for w in dict.fromkeys(data["wd"]) if w != "all"]
    colors = sns.color_palette("crest", n_colors=max(len(decays), 1))
    with style():
        fig, ax = plt.subplots(figsize=(6.2, 4.4))
        span = float(np.ptp(data["sd"])) if len(data) else 0.0
        for i, wd in enumerate(decays):
            rows = data[data["wd"] == wd]
            shift = (i - (len(decays) - 1) / 2) * 0.01 * (span or 1)  # keep error bars apart
            ax.errorbar(
                rows["sd"] + shift,
                rows["coupling"],
                yerr=np.abs(
                    np.vstack(
                        [rows["coupling"] - rows["ci_low"], rows["ci_high"] - rows["coupling"]]
                    )
                ),
                color=colors[i],
                marker="o",
                ms=3,
                lw=1,
                capsize=2,
                label=f"wd = {wd}",
            )
        pooled = data[data["wd"] == "all"]
        if not pooled.empty:
            ax.plot(
                pooled["sd"], pooled["coupling"], color="black", marker="s", lw=2, label="all wd"
            )
            ax.fill_between(
                pooled["sd"], pooled["ci_low"], pooled["ci_high"], color="0.5", alpha=0.25
            )
        if data.empty:
            _no_data(ax)
        else:
            ax.legend(title="weight decay", loc="best")
        ax.set(
            xlabel="stochastic-depth rate (drop-path rate of the last block)",
            ylabel=_label("coupling"),
            title="coupling vs stochastic depth (mean over seeds and images, 95% CI)",
        )
        return save(fig, path)


def vit_coupling_vs_accuracy(table: pd.DataFrame, path: str | Path) -> list[Path]:
    """Test accuracy vs coupling, one point per ViT coloured by its stochastic-depth rate, with
    its bootstrap CI over images (horizontal bars) and an OLS line per rate.

    `table`: a `stats.vit_model_table`.
    """
    require_columns(table, ["sd", "coupling", "coupling_low", "coupling_high", "test_accuracy"])
    data = table.dropna(subset=["coupling", "test_accuracy"])
    rates = sorted(data["sd"].unique())
    norm = Normalize(min(rates, default=0), max(rates, default=1) if len(rates) > 1 else 1)
    cmap = plt.get_cmap("viridis")
    with style():
        fig, ax = plt.subplots(figsize=(6.5, 4.8))
        err = np.abs(
            np.vstack(
                [data["coupling"] - data["coupling_low"], data["coupling_high"] - data["coupling"]]
            )
        )
        ax.errorbar(
            data["coupling"],
            data["test_accuracy"],
            xerr=err,
            fmt="none",
            ecolor="0.75",
            lw=0.8,
            zorder=1,
        )
        for rate in rates:
            rows = data[data["sd"] == rate]
            color = cmap(norm(rate))
            ax.scatter(
                rows["coupling"],
                rows["test_accuracy"],
                color=color,
                edgecolor="0.2",
                lw=0.3,
                zorder=2,
            )
            if len(rows) >= MIN_N_FIT and np.ptp(rows["coupling"]) > 0:
                slope, intercept = np.polyfit(rows["coupling"], rows["test_accuracy"], 1)
                xs = np.array([rows["coupling"].min(), rows["coupling"].max()])
                ax.plot(xs, intercept + slope * xs, color=color, lw=1)
        if data.empty:
            _no_data(ax)
        fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="stochastic-depth rate")
        within = data.assign(
            coupling=data["coupling"] - data.groupby("sd")["coupling"].transform("mean"),
            test_accuracy=data["test_accuracy"]
            - data.groupby("sd")["test_accuracy"].transform("mean"),
        )
        ax.set(
            xlabel=_label("coupling") + "\n(95% CI over images)",
            ylabel="test accuracy",
            title="coupling vs accuracy, one line per rate\nwithin rates (deviations from the "
            "rate's mean): " + _corr_text(within["coupling"], within["test_accuracy"]),
        )
        return save(fig, path)


# --------------------------------------------------------------------------- rendering by name
def render(
    name: str,
    source: str | Path,
    path: str | Path,
    selection: dict[str, object] | None = None,
    token_model: str | None = None,
) -> list[Path]:
    """Draw figure ``name`` of FIGURES from its input file ``source`` (CSV or NetCDF) at ``path``;
    ``selection`` (k, reading, variant, norm) and ``token_model`` as FIGURES says it takes.
    """
    if name not in FIGURES:
        raise ValueError(f"no figure named {name!r}; one of {', '.join(FIGURES)}")
    data = pd.read_csv(source) if str(source).endswith(".csv") else read_netcdf(source)
    at = dict(selection or {})
    adapters = {
        "depth_heatmaps": lambda: depth_heatmaps(select(data["depth_mis"], **at), path),
        "depth_heatmaps_over_training": lambda: depth_heatmaps_over_training(
            select(data["depth_mis"], **at), path
        ),
        "token_heatmaps": lambda: token_heatmaps(data, path, model=token_model, **at),
        "pca_trajectories": lambda: pca_trajectories(data, path, model=token_model),
        "singular_value_spectra": lambda: singular_value_spectra(data, path, model=token_model),
    }
    return adapters.get(name, lambda: globals()[name](data, path))()
