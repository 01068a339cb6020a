"""Token trajectories and spectra: LSS / expodistance per model, PCA polylines, singular values
of the block Jacobians.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import xarray as xr

from blockcoupling.figures.common import (
    block_colorbar,
    block_scale,
    label,
    no_data,
    save,
    seeded_numpy,
    style,
)
from blockcoupling.figures.heatmaps import init_order
from blockcoupling.stats.core import select


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
            2,
            1,
            figsize=(max(5, 0.7 * len(order) + 2), 7),
            sharex=True,
            squeeze=False,
            layout="constrained",
        )
        for ax, metric in zip(axes[:, 0], metrics):
            part = frame[frame["metric"] == metric]
            if part.empty:
                no_data(ax)
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
                with seeded_numpy(0):  # seaborn jitters with numpy's global generator
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
            elif ax.get_legend() is not None:  # beside the boxes, never over them
                sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), frameon=False)
            ax.set(ylabel=label(metric), xlabel="")
        plt.setp(axes[-1, 0].get_xticklabels(), rotation=45, ha="right", rotation_mode="anchor")
        axes[-1, 0].set_xlabel("model (one point per prompt: mean over tokens)")
        return save(fig, path)


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
    inits = init_order(da)
    finite = np.isfinite(da).any([d for d in da.dims if d != "layer"]).values
    layers = da["layer"].values
    drawn = layers[finite] if finite.any() else layers
    cmap, norm = block_scale(drawn)
    with style():
        fig, axes = plt.subplots(
            1, len(inits), figsize=(4.5 * len(inits) + 1, 4.2), squeeze=False, layout="constrained"
        )
        for ax, init in zip(axes[0], inits):
            xy = da.sel(init=init).transpose("token", "layer", "pc").values
            for line in xy:
                keep = np.isfinite(line).all(axis=1)
                ax.plot(line[keep, 0], line[keep, 1], color="0.75", lw=0.6, zorder=1)
                ax.scatter(
                    line[keep, 0],
                    line[keep, 1],
                    c=layers[keep],
                    cmap=cmap,
                    norm=norm,
                    s=8,
                    zorder=2,
                )
            if not np.isfinite(xy).any():
                no_data(ax)
            ax.set(
                title=f"{init}",
                xlabel=_pclabel(trajectories, model, init, prompt, 0),
                ylabel=_pclabel(trajectories, model, init, prompt, 1),
            )
        block_colorbar(fig, axes.ravel().tolist(), drawn, "depth (layer; 0 = input embedding)")
        fig.suptitle(f"{model}, prompt {prompt}: one line per token")
        return save(fig, path)


def _pclabel(trajectories: xr.Dataset, model: str, init: str, prompt: str, pc: int) -> str:
    """'PC n (x% of variance)' when `pca_explained` is present (a fraction in [0, 1])."""
    if "pca_explained" not in trajectories:
        return f"PC {pc + 1}"
    share = float(
        select(trajectories["pca_explained"], model=model, init=init, prompt=prompt, pc=pc)
    )
    return f"PC {pc + 1} ({100 * share:.0f}% of variance)" if np.isfinite(share) else f"PC {pc + 1}"


def singular_value_spectra(spectra: xr.Dataset, path: str | Path, model: str) -> list[Path]:
    """Singular values of J^l_tt vs rank, one line per block with data (one colour each), per
    init; log y.

    `spectra.singular_values`: dims (model, init, prompt, layer, rank); mean over prompts.
    """
    da = select(spectra["singular_values"], model=model).mean("prompt", skipna=True)
    da = da.where(da > 0)
    inits = init_order(da)
    finite = np.isfinite(da).any([d for d in da.dims if d != "layer"]).values
    layers = da["layer"].values[finite] if finite.any() else da["layer"].values
    cmap, norm = block_scale(layers)
    with style():
        fig, axes = plt.subplots(
            1,
            len(inits),
            figsize=(4.5 * len(inits) + 1, 4),
            sharey=True,
            squeeze=False,
            layout="constrained",
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
                no_data(ax)
            ax.set(title=init, xlabel="rank a (singular index, descending)")
        axes[0, 0].set_ylabel("singular value of $J^l$ (mean over prompts)")
        block_colorbar(fig, axes.ravel().tolist(), layers, "block $l$")
        fig.suptitle(model)
        return save(fig, path)
