"""Shared figure pieces: the style, byte-reproducible saving, axis labels, and the calibrated
coupling measures with their null levels (the statistics a panel quotes: ``figures.quotes``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm, Colormap, ListedColormap
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from blockcoupling.coupling import registry as measures_registry

matplotlib.use("Agg")

DPI = 150
MIN_N_FIT = 3
# Plain-text symbols of the registry's labels (its NetCDF long names too) as matplotlib mathtext,
# so that a figure prints m with subscript K, not "m_K".
MATH = {
    "‖U_lᵀU_l'‖²_F": r"$\|U_l^\top U_{l'}\|_F^2$",
    "‖V_lᵀV_l'‖²_F": r"$\|V_l^\top V_{l'}\|_F^2$",
    "l≠l'": r"$l \neq l'$",
    "|l−l'|=1": r"$|l - l'| = 1$",
    "m_K": r"$m_K$",
}


def math_label(text: str) -> str:
    """``text`` with the plain symbols of ``MATH`` in mathtext."""
    for plain, math in MATH.items():
        text = text.replace(plain, math)
    return text


MIS_LABEL = math_label("mis-coupling m_K (lower = more coupled)")
STEP_LABEL = "training step (log scale; 0 = initialization)"
LABELS = {
    **{m.summary: m.label for m in measures_registry.MEASURES if m.summary},
    "adjacent_coupling": "adjacent-layer coupling (−mean m_K, |l−l'|=1)",
    "adjacent_excess": "adjacent-layer excess (null − m_K, |l−l'|=1)",
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
    **{m.summary: m.short_label for m in measures_registry.MEASURES if m.summary},
    "log10_params": "log10 params",
    "n_layers": "depth",
    "d_model": "width",
    "log10_train_tokens": "log10 tokens",
}
# The coupling measures a model-comparing figure shows (the registry's tabulated ones, raw
# first), and each one's chance level: a column of the same table (one value per row) or a
# constant; and the adjacent-block version of those that have one.
MEASURES: dict[str, str | float] = {m.summary: m.summary_chance for m in measures_registry.shown()}
ADJACENT = {m.summary: m.adjacent for m in measures_registry.shown() if m.adjacent}
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
# No run-dependent metadata (the PDF's creation date): identical inputs give identical bytes.
FIXED_METADATA = {".png": {"Software": None}, ".pdf": {"CreationDate": None}}


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


def fix_layout(fig: plt.Figure) -> None:
    """Place everything as the saved files will show it: at dpi 150, one pass of the layout
    engine, then none, so that later draws (the tight box, each file) keep those places.
    """
    fig.set_dpi(DPI)
    fig.draw_without_rendering()
    fig.set_layout_engine("none")


def save(fig: plt.Figure, path: str | Path) -> list[Path]:
    """Save `fig` as `{stem}.png` (dpi 150) and `{stem}.pdf` (byte-reproducible: no creation
    date); `path` is a stem or a .png/.pdf path.
    """
    fix_layout(fig)
    return write(fig, path)


def write(fig: plt.Figure, path: str | Path) -> list[Path]:
    """`save` for a figure whose places `fix_layout` has fixed: both files in one tight box, and
    the figure closed; returns [png, pdf].
    """
    path = Path(path)
    stem = path.with_suffix("") if path.suffix.lower() in (".png", ".pdf") else path
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_name(f"{stem.name}.png"), stem.with_name(f"{stem.name}.pdf")]
    bbox = fig.get_tightbbox(fig.canvas.get_renderer()).padded(
        matplotlib.rcParams["savefig.pad_inches"]
    )
    for out in paths:  # one tight box for both: "tight" redraws per file
        fig.savefig(out, dpi=DPI, bbox_inches=bbox, metadata=FIXED_METADATA[out.suffix])
    plt.close(fig)
    return paths


@contextmanager
def seeded_numpy(seed: int) -> Iterator[None]:
    """Numpy's global generator seeded for the duration (restored afterwards)."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def label(column: str, width: int = 30) -> str:
    """Axis label with units for a table column (the column name if unknown); one longer than
    ``width`` characters puts its parenthesis on a second line, so it fits beside its panel.
    """
    text = LABELS.get(column, column)
    text = text.replace(" (", "\n(", 1) if len(text) > width else text
    return math_label(text)


def no_data(ax: plt.Axes, text: str = "no data", y: float = 0.5) -> None:
    """Mark an empty panel (``text`` centred at height ``y``, axes fraction)."""
    ax.text(0.5, y, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def require_columns(table: pd.DataFrame, columns: list[str] | tuple[str, ...]) -> None:
    """Raise a one-line error naming the columns ``table`` lacks."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"table lacks columns {missing} (has {list(table.columns)})")


def measures(table: pd.DataFrame) -> list[str]:
    """The MEASURES ``table`` holds with at least one finite value (raw coupling alone until the
    calibrated columns exist).
    """
    return [
        m
        for m in MEASURES
        if m in table.columns and np.isfinite(table[m].to_numpy(dtype=float)).any()
    ]


def null_values(table: pd.DataFrame, measure: str) -> np.ndarray | None:
    """The chance level of ``measure`` for each row of ``table`` (None when the table lacks it)."""
    null = MEASURES.get(measure)
    if isinstance(null, float):
        return np.full(len(table), null)
    if null is None or null not in table.columns:
        return None
    return table[null].to_numpy(dtype=float)


def interval(table: pd.DataFrame, column: str) -> np.ndarray | None:
    """(2, n) distances from ``column`` to its CI bounds (``{column}_low``/``_high``, or
    ``ci_low``/``ci_high`` for the raw coupling), or None when the table has none.
    """
    for low, high in ((f"{column}_low", f"{column}_high"), ("ci_low", "ci_high")):
        if {low, high} <= set(table.columns) and (low != "ci_low" or column == "coupling"):
            value = table[column].to_numpy(dtype=float)
            return np.abs(np.vstack([value - table[low], table[high] - value]))
    return None


def score_column_label(table: pd.DataFrame, column: str) -> str:
    """Label of the score column, named by `score_name` when the table has one."""
    if column == "score" and "score_name" in table.columns and table["score_name"].notna().any():
        return label(str(table["score_name"].dropna().iloc[0]))
    return label(column)


def long_form(table: pd.DataFrame, columns: list[str], key: str) -> pd.DataFrame:
    """``table`` once per column of ``columns`` in long form for a seaborn grid: its rows with
    ``key`` (the column's name), value, low and high (the column's CI, see ``interval``) and
    null (its chance level, see ``null_values``), NaN where the table has none.
    """
    parts = []
    for column in columns:
        value = table[column].to_numpy(dtype=float)
        err, null = interval(table, column), null_values(table, column)
        parts.append(
            table.assign(
                **{key: column},
                value=value,
                low=np.nan if err is None else value - err[0],
                high=np.nan if err is None else value + err[1],
                null=np.nan if null is None else null,
            )
        )
    return pd.concat(parts, ignore_index=True)


def draw_panels(grid: sns.FacetGrid, panel: Callable[..., None], **options: object) -> None:
    """``grid.map_dataframe(panel, **options)`` (``panel`` draws one facet's rows on the current
    axes), then the constrained layout back (seaborn's mapping applies a tight layout once).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The figure layout has changed to tight")
        grid.map_dataframe(panel, **options)
    grid.figure.set_layout_engine("constrained")


# --------------------------------------------------------------------------- statistics text
def wrap_name(name: str, width: int = 16) -> str:
    """A long model name broken onto lines at its hyphens (each line at most ``width``
    characters where the name allows).
    """
    lines: list[str] = []
    for part in name.split("-"):
        if lines and len(lines[-1]) + 1 + len(part) <= width:
            lines[-1] += "-" + part
        else:
            lines.append(part if not lines else "-" + part)
    return "\n".join(lines)


def step_label(step: float) -> str:
    """A checkpoint step as a tick label: 1000 -> '1000', 143000 -> '143k'."""
    return f"{step / 1000:g}k" if step >= 10000 else f"{step:g}"


def step_axis(ax: plt.Axes, steps: np.ndarray) -> None:
    """Symlog x axis (linear below 1, so step 0 shows) with a tick at every step plotted, each
    labelled with its value (``declutter`` hides those that would collide).
    """
    steps = np.unique(np.asarray(steps, dtype=float))
    ax.set_xscale("symlog", linthresh=1, linscale=0.5)
    ax.xaxis.set_major_locator(FixedLocator(steps))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: step_label(value)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(-0.3, steps.max() * 1.15 if len(steps) else 1)


def block_scale(blocks: np.ndarray, cmap: str = "viridis") -> tuple[Colormap, BoundaryNorm]:
    """A colour scale with one colour per block of ``blocks`` (the integer indices a figure
    draws, finite data only), each colour's band centred on its block, for ``block_colorbar``.
    """
    blocks = np.unique(np.asarray(blocks, dtype=int))
    if blocks.size == 0:
        blocks = np.array([0])
    colours = plt.get_cmap(cmap)(np.linspace(0, 1, blocks.size))
    bounds = np.arange(blocks.min(), blocks.max() + 2) - 0.5
    # one band per integer between the first and last block: the blocks drawn get the colours
    full = np.array(
        [colours[min(np.searchsorted(blocks, b), blocks.size - 1)] for b in bounds[:-1] + 0.5]
    )
    return ListedColormap(full), BoundaryNorm(bounds, len(full))


def block_colorbar(
    fig: plt.Figure, axes: list, blocks: np.ndarray, label: str, cmap: str = "viridis"
) -> None:
    """A colour bar of ``block_scale``: one band per block, ticks at regular whole-block steps
    (every block up to 12 blocks).
    """
    colours, norm = block_scale(blocks, cmap)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=colours), ax=axes, label=label)
    blocks = np.unique(np.asarray(blocks, dtype=int))
    step = max(1, int(np.ceil(blocks.size / 12)))
    bar.set_ticks(list(range(int(blocks.min()), int(blocks.max()) + 1, step)))
    bar.ax.minorticks_off()


def declutter(fig: plt.Figure, pad: float = 6.0) -> None:
    """Hide the x tick labels that would collide, on every axes of ``fig``: the first and the
    last stay, and from the left each one that clears the last shown and the final one; the
    ticks themselves stay.
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        if len(labels) < 3:
            continue
        boxes = [t.get_window_extent(renderer) for t in labels]
        order = np.argsort([box.x0 for box in boxes])
        right, last = -np.inf, boxes[order[-1]]
        for i in order[:-1]:
            box = boxes[i]
            if box.x0 < right + pad or box.x1 + pad > last.x0:
                labels[i].set_visible(False)
            else:
                right = box.x1
