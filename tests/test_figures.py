"""Every figure renders from small synthetic datasets (docs/datasets.md), including NaN and
single-model cases."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import matplotlib.text
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from matplotlib.collections import PathCollection

from blockcoupling import figures
from blockcoupling.figures import common, quotes
from blockcoupling.figures import crossmodel as figure_crossmodel
from blockcoupling.files.io import write_netcdf
from blockcoupling.pipeline import figure_registry
from blockcoupling.stats import checkpoints, core, crossmodel
from blockcoupling.stats.selection import Bootstrap, Selection

SEL = Selection(k=10)
TOKENS, LAYERS, PROMPTS, RANKS = 5, 4, 3, 6


def _coords(models: list[str], outer: str, outer_values: list) -> dict:
    """Shared coords: model metadata along `model`, prompts with `prompt_source`."""
    n = len(models)
    return {
        "model": models,
        outer: outer_values,
        "prompt": [f"arc-{i:04d}" for i in range(PROMPTS)],
        "prompt_source": ("prompt", ["arc"] * PROMPTS),
        "params": ("model", 10.0 ** (7 + np.arange(n))),
        "n_layers": ("model", np.full(n, LAYERS)),
        "d_model": ("model", 64 * (1 + np.arange(n))),
        "score": ("model", 30.0 + 5 * np.arange(n)),
        "base": ("model", np.arange(n) % 2 == 0),
        "family": ("model", ["pythia"] * n),
    }


def make_coupling(
    models: list[str], outer: str = "init", outer_values: list | None = None, seed: int = 0
) -> xr.Dataset:
    """Combined coupling.nc: depth_mis, coupling, adjacent_coupling, self/fixed_in/fixed_out_mis."""
    rng = np.random.default_rng(seed)
    outer_values = outer_values or ["trained", "random"]
    sel_dims = ("reading", "variant", "norm", "k")
    base = (len(models), len(outer_values), 1, 1, 1, 1, PROMPTS)
    lead = ("model", outer, *sel_dims, "prompt")
    layer = np.arange(1, LAYERS + 1)
    tok = np.arange(TOKENS)
    mis = rng.uniform(0.1, 1.0, (*base, LAYERS, LAYERS))
    mis[..., layer - 1, layer - 1] = 0.0
    tokens = np.full(
        (*base, LAYERS, LAYERS, TOKENS, TOKENS), np.nan
    )  # token families: block 2 only
    tokens[..., 1, 1, :, :] = rng.uniform(0.1, 1.0, (*base, TOKENS, TOKENS))
    fixed = np.repeat(tokens[..., None, :, :], TOKENS, axis=-3)
    ds = xr.Dataset(
        {
            "depth_mis": ((*lead, "layer", "layer_ref"), mis),
            "coupling": (lead, -mis.mean(axis=(-1, -2))),
            "adjacent_coupling": (lead, -mis[..., 0, 1]),
            "self_mis": ((*lead, "layer", "layer_ref", "token", "token_ref"), tokens),
            "fixed_in_mis": (
                (*lead, "layer", "layer_ref", "token_in", "token", "token_ref"),
                fixed,
            ),
            "fixed_out_mis": (
                (*lead, "layer", "layer_ref", "token_out", "token", "token_ref"),
                fixed,
            ),
        },
        coords=_coords(models, outer, outer_values)
        | {
            "reading": ["authors"],
            "variant": ["ujv"],
            "norm": ["p"],
            "k": [10],
            "layer": layer,
            "layer_ref": layer,
            "token": tok,
            "token_ref": tok,
            "token_in": tok,
            "token_out": tok,
        },
    )
    return ds


def make_trajectories(
    models: list[str], outer: str = "init", outer_values: list | None = None
) -> xr.Dataset:
    """Combined trajectories.nc: lss, expodistance (model, init, prompt, token), pca,
    pca_explained."""
    rng = np.random.default_rng(1)
    outer_values = outer_values or ["trained", "random"]
    shape = (len(models), len(outer_values), PROMPTS)
    return xr.Dataset(
        {
            "lss": ((*("model", outer, "prompt"), "token"), 1 + rng.gamma(2, 1, (*shape, TOKENS))),
            "expodistance": (
                (*("model", outer, "prompt"), "token"),
                rng.uniform(0, 1, (*shape, TOKENS)),
            ),
            "pca": (
                ("model", outer, "prompt", "layer", "token", "pc"),
                np.cumsum(rng.normal(size=(*shape, LAYERS + 1, TOKENS, 2)), axis=3),
            ),
            "pca_explained": (("model", outer, "prompt", "pc"), np.tile([0.6, 0.2], (*shape, 1))),
        },
        coords=_coords(models, outer, outer_values)
        | {"layer": np.arange(LAYERS + 1), "token": np.arange(TOKENS), "pc": [0, 1]},
    )


def make_spectra(models: list[str]) -> xr.Dataset:
    """Combined spectra.nc: singular_values (model, init, prompt, layer, rank), descending."""
    rng = np.random.default_rng(2)
    sv = -np.sort(-rng.gamma(2, 1, (len(models), 2, PROMPTS, LAYERS, RANKS)), axis=-1)
    return xr.Dataset(
        {"singular_values": (("model", "init", "prompt", "layer", "rank"), sv)},
        coords=_coords(models, "init", ["trained", "random"])
        | {"layer": np.arange(1, LAYERS + 1), "rank": np.arange(RANKS)},
    )


def make_checkpoint_table(models: list[str], steps: list[int]) -> tuple[pd.DataFrame, xr.Dataset]:
    """checkpoint_table output (via stats) and the checkpoint depth_mis (model, step, prompt,
    layer, layer_ref)."""
    ds = make_coupling(models, "step", steps)
    history = pd.DataFrame(
        [(m, s, 10 / np.log(s + 3) + i) for i, m in enumerate(models) for s in steps],
        columns=["model", "step", "val_loss"],
    )
    traj = make_trajectories(models, "step", steps)
    table = checkpoints.checkpoint_table(ds, history, traj)
    return table, core.select(ds["depth_mis"], **SEL)


def model_table(models: list[str]) -> pd.DataFrame:
    """crossmodel.model_table from the synthetic coupling dataset."""
    return crossmodel.model_table(
        crossmodel.model_coupling(make_coupling(models), boot=Bootstrap(n_boot=50))
    )


def with_calibration(table: pd.DataFrame, k: int = 10) -> pd.DataFrame:
    """``table`` with the calibrated columns of the contract (h16's names): a chance level of raw
    coupling per row, the excess over it (raw minus null), the overlap and its null K/d."""
    rng = np.random.default_rng(3)
    null = -0.9 + 0.02 * rng.normal(size=len(table))
    d = table["d_model"].to_numpy(dtype=float) if "d_model" in table else np.full(len(table), 64)
    return table.assign(
        coupling_null=null,
        coupling_excess=table["coupling"] - null,
        adjacent_excess=table.get("adjacent_coupling", table["coupling"]) - null,
        overlap_u=rng.uniform(0.2, 0.6, len(table)),
        overlap_null=k / d,
    )


# The analyses a figure panel draws (figures.crossmodel.PANEL_CLAIMS, the ViT excess panels), as
# the stats rules write them: a primary test with its Holm p, exploratory rows without one.
ANALYSES = pd.DataFrame(
    {
        "analysis": [
            "fixed_size_excess_vs_bpb_rank_adjusted",
            "fixed_size_coupling_vs_bpb_rank_adjusted",
            "vit_sd_effect",
            "vit_accuracy_within_rate",
        ],
        "estimate": [0.2345, -0.0412, -0.01114, 0.5],
        "ci_low": [-0.1234, -0.4, -0.0484, np.nan],
        "ci_high": [0.5678, 0.31, 0.0262, np.nan],
        "unit": ["runs", "runs", "seeds", "ViTs"],
        "n": [10, 10, 4, 20],
        "p": [0.2106, 0.81, 0.536, np.nan],
        "p_wild": [0.25, 0.79, np.nan, np.nan],
        "p_holm": [0.6318, np.nan, 0.9, np.nan],
        "note": ["", "", "", ""],
    }
)


def make_claims() -> pd.DataFrame:
    """A claims table (stats.claims.claims_table) of ``ANALYSES``, the first and third primary."""
    from blockcoupling.stats import claims

    primary = {name: {"effect": 0.5} for name in ANALYSES["analysis"].iloc[[0, 2]]}
    return claims.claims_table(ANALYSES, primary)


def calibration_frame(table: pd.DataFrame, ks=(4, 50)) -> pd.DataFrame:
    """A stats.calibration table from a model table: each model trained and as its twin (a
    lower coupling, the same chance levels) at each K, with an effective rank."""
    frames = [
        table.drop(columns=["init"], errors="ignore").assign(
            k=k,
            init=init,
            coupling=table["coupling"] - shift,
            effective_rank=np.linspace(3.0, 30.0, len(table)) + 10 * shift,
            n_prompts=PROMPTS,
        )
        for k in ks
        for init, shift in (("trained", 0.0), ("random", 0.1))
    ]
    return pd.concat(frames, ignore_index=True)


def assert_written(paths: list[Path]) -> None:
    """PNG and PDF exist side by side, are non-empty, and the PNG decodes to a plausible image."""
    png, pdf = paths
    assert (
        png.suffix == ".png" and pdf.suffix == ".pdf" and png.with_suffix("") == pdf.with_suffix("")
    )
    assert png.stat().st_size > 1000 and pdf.stat().st_size > 1000
    image = mpimg.imread(png)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200


MANY = ["m-a", "m-b", "m-c", "m-d", "m-e"]


def fixed_size_runs(table: pd.DataFrame) -> pd.DataFrame:
    """A fixed_size_runs.csv of ``table``'s fixed-size models: held-out means (the table's
    measures, shifted) and -bpb (its score)."""
    fixed = table[table["family"] == "fixed_size"]
    held = {
        f"{m}_held_out": fixed[m].to_numpy() + 0.01
        for m in ("coupling", "coupling_excess", "overlap_u")
        if m in fixed
    }
    return pd.DataFrame({"model": fixed["model"].to_numpy(), **held, "neg_bpb": fixed["score"]})


def with_nan_padding(ds: xr.Dataset, traj: xr.Dataset, models: list[str]) -> None:
    """Outer-join gaps in place: a shallower model, a model without data, short prompts, missing
    tokens (``models``: at least four)."""
    ds["depth_mis"].loc[dict(model=models[1], layer=4)] = np.nan
    ds["depth_mis"].loc[dict(model=models[1], layer_ref=4)] = np.nan
    ds["depth_mis"].loc[dict(model=models[2])] = np.nan
    ds["self_mis"].loc[dict(token=[3, 4])] = np.nan
    traj["lss"].loc[dict(model=models[3])] = np.nan
    traj["pca"].loc[dict(token=4)] = np.nan


def test_fixed_token_and_no_known_score(tmp_path):
    ds = make_coupling(MANY[:2])
    assert_written(figures.token_heatmaps(ds, tmp_path / "tokens", model="m-b", fixed_token=1))
    table = model_table(MANY[:2])
    table["score"] = np.nan  # no known score: empty scatter, "n too small", no fit
    assert_written(figures.coupling_vs_score(table, tmp_path / "empty"))


def test_pick_steps_early_middle_final():
    assert figures.pick_steps([0, 1, 2, 4, 1000, 143000]) == [0, 1000, 143000]
    assert figures.pick_steps([512, 0]) == [0, 512]
    assert figures.pick_steps([]) == []


def test_save_accepts_stem_and_png_and_rejects_missing_columns(tmp_path):
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots()
    assert figures.save(fig, tmp_path / "a" / "x.y.png") == [
        tmp_path / "a" / "x.y.png",
        tmp_path / "a" / "x.y.pdf",
    ]
    with pytest.raises(ValueError, match="lacks columns"):
        figures.coupling_vs_step(pd.DataFrame({"model": [], "step": []}), tmp_path / "z")


def test_the_same_figure_twice_gives_the_same_bytes(tmp_path):
    """No creation date or other run-dependent metadata in the PNG or the PDF (a date in the PDF
    made identical runs differ); the jittered strip plot is seeded."""
    traj = make_trajectories(MANY)
    first = figures.lss_expodistance(traj, tmp_path / "a" / "lss")
    second = figures.lss_expodistance(traj, tmp_path / "b" / "lss")
    for one, two in zip(first, second):
        assert one.read_bytes() == two.read_bytes(), one.name
    assert b"CreationDate" not in first[1].read_bytes()


def test_calibrated_measures_with_their_null_levels_or_raw_alone():
    table = with_calibration(model_table(MANY))
    assert common.measures(table) == ["coupling", "coupling_excess", "overlap_u"]
    assert common.null_values(table, "coupling") == pytest.approx(table["coupling_null"])
    assert common.null_values(table, "coupling_excess") == pytest.approx(np.zeros(len(table)))
    assert common.null_values(table, "overlap_u") == pytest.approx(10 / table["d_model"])
    raw = model_table(MANY)  # before the calibrated columns exist: raw m_K alone, no null
    assert common.measures(raw) == ["coupling"] and common.null_values(raw, "coupling") is None
    nan = table.assign(overlap_u=np.nan)  # a measure without any value is not a panel
    assert common.measures(nan) == ["coupling", "coupling_excess"]


def test_designs_keep_pretrained_models_beside_the_grid_never_pooled():
    table = pd.DataFrame(
        {
            "model": ["g1", "g2", "g3", "g4", "smol", "gemma", "g5"],
            "family": ["grid"] * 4 + ["SmolLM2", "Gemma-3", "grid"],
            "score": [1.0, 2.0, 3.0, 4.0, 50.0, 60.0, np.nan],
        }
    )
    groups = figure_crossmodel.designs(table)
    assert [name for name, _ in groups] == ["grid", figure_crossmodel.OTHER]
    assert list(groups[0][1]["model"]) == ["g1", "g2", "g3", "g4", "g5"]
    assert list(groups[1][1]["model"]) == ["smol", "gemma"]
    one = figure_crossmodel.designs(
        table.assign(family=np.nan)
    )  # no family: one design, all models
    assert [name for name, _ in one] == ["all models"] and len(one[0][1]) == len(table)


def test_titles_quote_the_statistics_table_old_and_new_columns():
    old = pd.DataFrame(
        {"subset": ["all"], "predictor": ["coupling"], "method": ["pearson"], "r": [0.414]}
        | {"ci_low": [0.12], "ci_high": [0.7], "p": [0.0123], "p_holm": [0.05], "n": [20]}
    )
    text = quotes.first_text(old, "Pearson r", dict(subset="all", predictor="coupling"))
    assert text == "Pearson r +0.41 [+0.12, +0.70], p = 0.012, Holm p = 0.05, n = 20"
    new = pd.DataFrame(
        {"analysis": ["excess_vs_bpb"], "estimate": [-0.2], "ci_low": [-0.5], "ci_high": [0.1]}
        | {"unit": ["bpb per sd"], "n": [18], "p": [0.2], "p_holm": [0.4], "primary": [True]}
    )
    text = quotes.first_text(new, "slope", dict(subset="all"), dict(analysis="excess_vs_bpb"))
    assert text == "slope -0.20 [-0.50, +0.10] bpb per sd, p = 0.2, Holm p = 0.4, n = 18; primary"
    exploratory = quotes.stat_text(new.assign(primary=False).iloc[0], "slope")
    assert exploratory.endswith("; exploratory")
    assert quotes.first_text(None, "r", dict(subset="all")) == "r: no row in the statistics table"
    undefined = quotes.stat_text(old.assign(r=np.nan, reason="constant x").iloc[0], "r")
    assert undefined == "r: constant x (n = 20)"
    assert quotes.stat_text(old.assign(r=np.nan, reason="n=2 < 4").iloc[0], "r") == "r: n=2 < 4"


def test_render_reads_the_tables_the_registry_names(tmp_path):
    table = with_calibration(model_table(MANY))
    summary, correlations = tmp_path / "summary.csv", tmp_path / "correlations.csv"
    table.to_csv(summary, index=False)
    crossmodel.correlations(table).to_csv(correlations, index=False)
    assert figures.FIGURES["coupling_vs_score"][3] == (
        "results/stats/correlations.csv",
        "results/stats/fixed_size_runs.csv",
        "results/stats/claims.csv",
    )
    assert_written(
        figures.render("coupling_vs_score", summary, tmp_path / "fig", tables=[correlations])
    )


# --------------------------------------------------------------------------- layout of every figure
def _corners(text, renderer) -> np.ndarray:
    """(4, 2) display corners of ``text``'s (possibly rotated) box: its unrotated size turned by
    its rotation, placed so its axis-aligned extent is ``get_window_extent``'s.
    """
    box = text.get_window_extent(renderer)
    rotation = text.get_rotation()
    if rotation == 0:
        return np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])
    text.set_rotation(0)
    flat = text.get_window_extent(renderer)
    text.set_rotation(rotation)
    theta = np.deg2rad(rotation)
    turn = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    corners = np.array([[0, 0], [flat.width, 0], [flat.width, flat.height], [0, flat.height]])
    corners = corners @ turn.T
    return corners - corners.min(axis=0) + [box.x0, box.y0]


def _overlap(a: np.ndarray, b: np.ndarray, tolerance: float = 1.0) -> bool:
    """Whether two convex quadrilaterals overlap by more than ``tolerance`` pixels along every
    separating axis (their edges' normals).
    """
    for poly in (a, b):
        for i in range(4):
            edge = poly[(i + 1) % 4] - poly[i]
            normal = np.array([-edge[1], edge[0]]) / (np.hypot(*edge) or 1.0)
            pa, pb = a @ normal, b @ normal
            if min(pa.max(), pb.max()) - max(pa.min(), pb.min()) <= tolerance:
                return False
    return True


def _has_content(ax) -> bool:
    """Whether ``ax`` shows anything: a data line (not a reference line such as ``axhline``)
    or collection with a finite point, an image, a patch, a text or a legend.
    """
    lines = any(
        line.get_transform() == ax.transData and np.isfinite(line.get_xydata()).all(axis=1).any()
        for line in ax.lines
    )
    collections = any(
        any(np.isfinite(path.vertices).all(axis=1).any() for path in c.get_paths())
        or (isinstance(c, PathCollection) and np.isfinite(np.asarray(c.get_offsets())).any())
        for c in ax.collections
    )
    texts = any(t.get_visible() and t.get_text().strip() for t in ax.texts)
    return bool(lines or collections or ax.images or ax.patches or texts or ax.get_legend())


def layout_problems(fig) -> list[str]:
    """Every pair of drawn, non-empty text elements whose boxes overlap, every text of one axes
    (a label, tick label, title, legend) that lies over another's plotting area, every text with
    a superscript outside mathtext, and every axes with nothing in it (an empty or switched-off
    panel slot), in the places ``common.fix_layout`` fixes (it is called here: write the figure
    with ``common.write``).
    """
    import matplotlib.text

    drawn = []
    original = matplotlib.text.Text.draw

    def record(self, renderer):
        original(self, renderer)
        if self.get_visible() and self.get_text().strip() and self.get_alpha() != 0:
            drawn.append(self)

    matplotlib.text.Text.draw = record
    try:
        common.fix_layout(fig)  # the places common.save writes; its draw renders no pixels
    finally:
        matplotlib.text.Text.draw = original
    renderer = fig.canvas.get_renderer()
    shapes = [(t, _corners(t, renderer)) for t in dict.fromkeys(drawn)]
    problems = [
        f"text {a.get_text()!r} overlaps {b.get_text()!r}"
        for i, (a, pa) in enumerate(shapes)
        for b, pb in shapes[i + 1 :]
        if _overlap(pa, pb)
    ]
    panels = [(ax, ax.patch.get_window_extent(renderer)) for ax in fig.axes if ax.axison]
    problems += [
        f"text {t.get_text()!r} lies over another panel"
        for t, shape in shapes
        for ax, box in panels
        if t.axes is not None
        and t.axes is not ax
        and _overlap(
            shape,
            np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]]),
        )
    ]
    problems += [
        f"empty axes at {ax.get_position().bounds}" for ax in fig.axes if not _has_content(ax)
    ]
    problems += [  # a symbol as typed ("J^l"), not in mathtext
        f"text {t.get_text()!r} prints a superscript as typed"
        for t in dict.fromkeys(drawn)
        if re.search(r"\w\^", re.sub(r"\$[^$]*\$", "", t.get_text()))
    ]
    return problems + merged_ticks(fig, drawn)


def merged_ticks(fig, drawn, gap: float = 3.0) -> list[str]:
    """Neighbouring unrotated tick labels of one axis drawn less than ``gap`` pixels apart (a
    space at dpi 150 is about 4): they read as one number ("8" and "10" as "810"). Rotated
    labels (read along their slant) are left to the overlap check.
    """
    renderer = fig.canvas.get_renderer()
    shown = set(drawn)
    problems = []
    for ax in fig.axes:
        for axis, low, high in ((ax.xaxis, "x0", "x1"), (ax.yaxis, "y0", "y1")):
            boxes = sorted(
                (getattr(box, low), getattr(box, high), text.get_text())
                for text in axis.get_ticklabels()
                if text in shown and text.get_rotation() == 0
                for box in [text.get_window_extent(renderer)]
            )
            problems += [
                f"tick labels {a!r} and {b!r} run together"
                for (_, end, a), (start, _, b) in zip(boxes, boxes[1:])
                if start - end < gap
            ]
    return problems


LONG = [
    "fixed_size-f0.02-wd0.0-s0-final",
    "fixed_size-f0.02-wd1.0-s1-final",
    "fixed_size-f0.2-wd0.0-s0-final",
    "fixed_size-f1.0-wd1.0-s1-final",
    "smollm2-135m",
    "gemma3-270m",
]
RUNS = ["emergence-lr0.001-s0", "emergence-lr0.001-s1", "emergence-lr0.004-s0"]
STEPS = [0, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]


def registered_inputs(folder: Path, few: bool = False) -> dict[str, tuple[Path, list[Path], dict]]:
    """A smoke-like input file (and statistics tables) for every figure of ``figures.FIGURES``,
    written under ``folder``: name -> (source, tables, options). Many: six models of two designs
    with the gaps of an outer join (``with_nan_padding``, one unknown score), three runs of eleven
    checkpoints (one step without its trajectory metric), five ViT rates, every measure
    calibrated. ``few``: the least a run can have, one model, one run of three checkpoints, one
    ViT seed and decay, so that no statistic is estimable, and the raw measures alone (no
    calibration) where the language models' figures allow it.
    """
    from test_vit_stats import SEL as VIT_SEL
    from test_vit_stats import make_combined

    from blockcoupling.stats import vit

    models = LONG[:1] if few else LONG
    ds = make_coupling(models)
    families = ["fixed_size"] if few else ["fixed_size"] * 4 + ["SmolLM2", "Gemma-3"]
    ds = ds.assign_coords(family=("model", families))
    trajectories = make_trajectories(models)
    if not few:
        with_nan_padding(ds, trajectories, models)
        ds = ds.assign_coords(score=ds["score"].where(ds["model"] != models[1]))
    calibrated = (lambda table: table) if few else with_calibration
    table = calibrated(
        crossmodel.model_table(crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=50)))
    )
    subsets = crossmodel.table_subsets(table)
    checkpoint, depth = (
        make_checkpoint_table(RUNS[:1], [0, 2, 8]) if few else make_checkpoint_table(RUNS, STEPS)
    )
    if not few:
        checkpoint.loc[checkpoint["step"] == 8, "lss"] = np.nan
    checkpoint = calibrated(checkpoint)
    vit_ds = make_combined().isel(wd=[1], seed=[0]) if few else make_combined()
    excess = vit_ds["coupling"] * 0 + np.random.default_rng(4).normal(
        0.1, 0.02, vit_ds["coupling"].shape
    )
    vit_ds = vit_ds.assign(  # calibrated, as vit_results writes it (test_vit_stats)
        coupling_excess=excess,
        coupling_null=vit_ds["coupling"] + excess,
        overlap_u=excess * 2 + 0.3,
        overlap_null=xr.full_like(vit_ds["test_accuracy"], 0.25).expand_dims(k=[4], axis=-1),
    )
    vit_table = vit.vit_model_table(vit_ds, VIT_SEL, Bootstrap(n_boot=50))
    predictors = ("coupling",) if few else ("coupling", "coupling_excess", "overlap_u")
    frames = {
        "summary.csv": table,
        "correlations.csv": crossmodel.correlations(table, predictors=predictors, subsets=subsets),
        "k_sweep.csv": crossmodel.k_sweep(ds, table, subsets=subsets),
        "checkpoint_table.csv": checkpoint,
        "checkpoint_points.csv": core.without_intervals(checkpoint),
        "checkpoint_correlations.csv": checkpoints.checkpoint_correlations(checkpoint),
        "vit_coupling_vs_sd.csv": vit.vit_coupling_by_rate(vit_ds, VIT_SEL, Bootstrap(n_boot=50)),
        "vit_sd_trend.csv": vit.vit_sd_trend(vit_table),
        "vit_models.csv": vit_table,
        "vit_coupling_vs_accuracy.csv": vit.vit_coupling_accuracy(vit_table),
        "claims.csv": make_claims(),
        "calibration.csv": calibration_frame(table),
        "fixed_size_runs.csv": fixed_size_runs(table),
    }
    for name, frame in frames.items():
        core.write_table(frame, folder / name)
    # written as jobs write them: declaring the outer join's NaN (read_netcdf refuses others)
    write_netcdf(ds, folder / "coupling.nc")
    write_netcdf(ds, folder / "tokens.nc")
    write_netcdf(trajectories, folder / "trajectories.nc")
    write_netcdf(make_spectra(models), folder / "spectra.nc")
    write_netcdf(depth.to_dataset(name="depth_mis"), folder / "checkpoint_coupling.nc")
    files = {
        "results/combined/checkpoints/coupling.nc": folder / "checkpoint_coupling.nc",
        **{f"results/combined/{n}": folder / n for n in ("coupling.nc", "tokens.nc")},
        **{f"results/combined/{n}": folder / n for n in ("trajectories.nc", "spectra.nc")},
        **{f"results/stats/{n}": folder / n for n in frames},
    }
    options = {"selection": SEL, "token_model": LONG[0]}
    return {
        name: (
            files[source],
            [files[t] for t in tables],
            {key: options[key] for key in takes},
        )
        for name, (_, source, takes, tables) in figures.FIGURES.items()
    }


@pytest.fixture(scope="module")
def registered(tmp_path_factory) -> dict[str, dict[str, tuple[Path, list[Path], dict]]]:
    return {
        size: registered_inputs(tmp_path_factory.mktemp(size), few=size == "few")
        for size in ("many", "few")
    }


@pytest.mark.parametrize("size", ["many", "few"])
@pytest.mark.parametrize("name", list(figures.FIGURES))
def test_no_text_overlaps_and_no_empty_axes(name, size, registered, tmp_path, monkeypatch):
    """Every registered figure renders from smoke-like tables with long model names
    (``registered_inputs``): many models with an outer join's gaps, calibrated, and a single
    model, run and ViT with raw measures alone (no statistic estimable). PNG and PDF are written,
    no two text elements (titles, labels, tick labels, legend entries) overlap, no text lies over
    another panel and no panel slot is empty."""
    found = []

    def checked_save(fig, path):  # common.save, its layout checked where it was fixed
        found.extend(layout_problems(fig))
        return common.write(fig, path)

    for module in (figure_crossmodel, *(getattr(figures, m) for m in LAYOUT_MODULES)):
        monkeypatch.setattr(module, "save", checked_save)
    source, tables, options = registered[size][name]
    assert_written(figures.render(name, source, tmp_path / name, tables=tables, **options))
    assert not found, f"{name}: " + "; ".join(found)


LAYOUT_MODULES = ("checkpoints", "heatmaps", "trajectories", "vit")


def test_the_layout_check_finds_overlaps_stray_texts_and_empty_panels():
    """layout_problems on a hand-made figure with one of each problem (and a constrained layout,
    as the registered figures have): it names all three, and nothing on the same figure without
    them."""

    def figure(broken: bool):
        fig, (left, right) = plt.subplots(1, 2, figsize=(4, 2), layout="constrained")
        left.plot([0, 1], [0, 1])
        left.text(0.5, 0.5, "first label", transform=left.transAxes)
        left.text(0.5, 0.1 if not broken else 0.5, "second label", transform=left.transAxes)
        if broken:  # a text of the left panel drawn into the right one; the right one empty
            left.text(2.0, 0.5, "stray", transform=left.transAxes, clip_on=False)
        else:
            right.plot([0, 1], [1, 0])
        return fig

    with common.style():
        problems = layout_problems(figure(broken=True))
        clean = layout_problems(figure(broken=False))
    plt.close("all")
    assert any("'first label' overlaps 'second label'" in p for p in problems), problems
    assert any("'stray' lies over another panel" in p for p in problems), problems
    assert any(p.startswith("empty axes") for p in problems), problems
    assert clean == []


def figure_texts(figure: str, registered: dict, monkeypatch) -> list[str]:
    """Every text a registered figure ("many") shows, read from its matplotlib objects (axes
    titles, texts, legends, the figure's own texts), each on one line (wrapping undone)."""
    found: list[str] = []

    def keep(fig, path):
        texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible()]
        found.extend(" ".join(t.get_text().replace("\u00a0", " ").split()) for t in texts)
        plt.close(fig)
        return []

    for module in (figure_crossmodel, *(getattr(figures, m) for m in LAYOUT_MODULES)):
        monkeypatch.setattr(module, "save", keep)
    monkeypatch.setattr(importlib.import_module("blockcoupling.figures.calibration"), "save", keep)
    source, tables, options = registered["many"][figure]
    figures.render(figure, source, "unused", tables=tables, **options)
    return [t for t in found if t]


def test_every_claims_row_is_tied_to_a_registered_figure():
    """Each row of the claims table (stats.claims.CLAIMS) names the figure that draws its
    measure (figure_registry.CLAIM_FIGURES), a registered one that reads claims.csv and the K."""
    from blockcoupling.stats import claims

    untied = [c.analysis for c in claims.CLAIMS if c.analysis not in figure_registry.CLAIM_FIGURES]
    assert not untied, f"claims rows without a figure (add them to CLAIM_FIGURES): {untied}"
    stale = set(figure_registry.CLAIM_FIGURES) - {c.analysis for c in claims.CLAIMS}
    assert not stale, stale
    for figure in set(figure_registry.CLAIM_FIGURES.values()):
        _, _, takes, tables = figures.FIGURES[figure]
        assert figure_registry.CLAIMS_TABLE in tables and "selection" in takes, figure


TIED = sorted(set(figure_registry.CLAIM_FIGURES.values()))
NO_K = {"trajectory_metrics_vs_step"}  # LSS and expodistance: no Jacobian, no K (said so)


@pytest.mark.parametrize("figure", TIED)
def test_tied_figures_quote_their_claims_rows_as_claims_csv_has_them(
    figure, registered, monkeypatch
):
    """Every figure a claims row is tied to prints that row as claims.md does (estimate
    [interval] unit (n), p, wild p, Holm p, primary or exploratory, verdict), states K and the
    chance level it draws, and no other text of it carries a verdict of its own. (Before,
    claims.csv reached three figures: coupling_vs_step quoted nothing, coupling_vs_validation_loss
    said "no row" beside the within-run primary.)"""
    from blockcoupling.stats import claims

    table = make_claims()
    markdown = claims.claims_markdown(table, "abc1234")
    text = " ".join(figure_texts(figure, registered, monkeypatch))
    k = "K = none" if figure in NO_K else f"K = {SEL.k}"
    assert k in text and "chance level: " in text, text
    for analysis in figure_registry.claim_rows(figure):
        claim = claims.claim_of(analysis)
        row = next(line for line in markdown.splitlines() if line.startswith(f"| {claim} |"))
        cells = [cell.strip() for cell in row.strip("| ").split(" | ")]
        estimate, unit, p, wild, p_holm = cells[2], cells[3], cells[4], cells[5], cells[6]
        kind = "(primary)" if cells[7] == "yes" else "(exploratory)"
        expected = [f"{claim} {kind}: {estimate} {unit}".rstrip(), cells[11].strip("*")]
        expected += ([f"p = {p}"] if p else []) + ([f"wild p = {wild}"] if wild else [])
        expected += [f"Holm p = {p_holm}"] if p_holm else []
        assert all(part in text for part in expected), (figure, expected, text)


def test_a_fit_line_is_drawn_only_where_it_agrees_in_sign_with_its_claims(monkeypatch):
    """coupling_vs_score drew a falling line under a claim quoted at +0.137: in a panel whose
    measure a claims row rests on, the least-squares line is drawn only when its slope has the
    row's sign; else the panel says why there is none."""
    from blockcoupling.stats import claims as claims_module

    ds = make_coupling(MANY).assign_coords(family=("model", ["fixed_size"] * 4 + ["other"]))
    table = with_calibration(
        crossmodel.model_table(crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=20)))
    )
    correlations = crossmodel.correlations(
        table, predictors=("coupling_excess",), subsets=crossmodel.table_subsets(table)
    )
    row = quotes.first_row(
        correlations,
        dict(subset="family:fixed_size", predictor="coupling_excess", method="pearson"),
    )
    assert quotes.estimable(row)
    drawn: dict[str, tuple[int, str]] = {}

    def count(fig, path):
        for ax in fig.axes:
            if (
                ax.get_xlabel().startswith("calibrated excess")
                and ax.get_subplotspec().colspan.start == 0
            ):
                fits = [line for line in ax.lines if line.get_color() == "0.3"]
                drawn["excess"] = (len(fits), ax.get_title())
        plt.close(fig)

    monkeypatch.setattr(figure_crossmodel, "save", count)
    for sign in (1, -1):
        analyses = ANALYSES.iloc[:1].assign(estimate=sign * np.sign(row["r"]) * 0.2, n=4)
        claims = claims_module.claims_table(analyses, {})
        figures.coupling_vs_score(table, "unused", correlations=correlations, claims=claims)
        lines, title = drawn["excess"]
        if sign == 1:
            assert lines == 1 and "no line" not in title, title
            assert "line: least squares; the claims'" in title and "0.2" in title, title
        else:
            assert lines == 0 and "no line: its slope's sign differs" in title, title


def test_fixed_size_panels_plot_the_claims_held_out_data(monkeypatch):
    """coupling_vs_score plotted summary.csv (every prompt) in the fixed-size column while its
    claims rows are fitted on the held-out prompts (fixed_size_runs.csv): there the points fell
    while the claims rose, so no line. Given the runs table, that column plots each run's
    held-out mean against -bpb: the claims' points, and the line with their sign.
    """
    from blockcoupling.stats import claims as claims_module

    ds = make_coupling(MANY).assign_coords(family=("model", ["fixed_size"] * 4 + ["other"]))
    table = with_calibration(
        crossmodel.model_table(crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=20)))
    )
    fixed = table[table["family"] == "fixed_size"]
    everything = np.polyfit(fixed["coupling_excess"], fixed["score"], 1)[0]
    held_out = -fixed["coupling_excess"].to_numpy() + 0.01 * np.arange(4)  # the other sign
    runs = pd.DataFrame(
        {
            "model": fixed["model"].to_numpy(),
            "coupling_excess_held_out": held_out,
            "neg_bpb": fixed["score"].to_numpy(),
        }
    )
    assert np.sign(np.polyfit(held_out, runs["neg_bpb"], 1)[0]) == -np.sign(everything)
    analyses = ANALYSES.iloc[:1].assign(estimate=-np.sign(everything) * 0.2, n=4)
    claims = claims_module.claims_table(analyses, {})
    drawn: dict[str, object] = {}

    def inspect(fig, path):
        for ax in fig.axes:
            if (
                ax.get_xlabel().startswith("calibrated excess")
                and ax.get_subplotspec().colspan.start == 0
            ):
                drawn["lines"] = [line for line in ax.lines if line.get_color() == "0.3"]
                drawn["x"] = np.concatenate([c.get_offsets()[:, 0] for c in ax.collections])
                drawn["title"] = ax.get_title()
        plt.close(fig)

    monkeypatch.setattr(figure_crossmodel, "save", inspect)
    figures.coupling_vs_score(table, "unused", claims=claims, fixed_size_runs=runs)
    assert len(drawn["lines"]) == 1, drawn["title"]
    assert sorted(drawn["x"]) == pytest.approx(sorted(held_out))
    assert "held-out prompts" in drawn["title"] and "0.2" in drawn["title"]


def test_every_caption_names_its_paper_figure():
    """Each registered figure's report caption opens with the paper figure it corresponds to
    (or says it has none)."""
    root = Path(__file__).resolve().parents[1] / "report"
    for name in figures.FIGURES:
        caption = (root / f"{name}.rst").read_text()
        first = caption.split(". ")[0]
        assert re.match(r"Paper: (Figures? \d|the .*\(labels? ``|no figure)", first), name


def test_every_fit_line_comes_from_a_claims_row_the_panel_quotes(monkeypatch):
    """coupling_vs_score drew a least-squares line wherever the correlations table (an analysis
    row) estimated the panel's correlation: the overlap panel, which no claims row rests on
    (its slope is only the sign condition of the across-runs claim), had one. Lines now come
    only where claims rows rest on the panel (n and sign agreeing), quoted in its title; every
    other panel says why it has none."""
    from blockcoupling.stats import claims as claims_module

    ds = make_coupling(MANY).assign_coords(family=("model", ["fixed_size"] * 4 + ["other"]))
    table = with_calibration(
        crossmodel.model_table(crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=20)))
    )
    shown = ("coupling", "coupling_excess", "overlap_u")
    correlations = crossmodel.correlations(
        table, predictors=shown, subsets=crossmodel.table_subsets(table)
    )
    assert all(
        quotes.estimable(figure_crossmodel._correlation_row(correlations, "fixed_size", m))
        for m in shown
    )  # every panel has an exploratory row: none of them may draw a line from it
    drawn: dict[tuple[int, str], tuple[int, str]] = {}

    def count(fig, path):
        for ax in fig.axes:
            fits = [line for line in ax.lines if line.get_color() == "0.3"]
            column = ax.get_subplotspec().colspan.start  # 0: the family, 1: the others
            drawn[(column, ax.get_xlabel().split("\n")[0].split(" ")[0])] = (
                len(fits),
                ax.get_title(),
            )
        plt.close(fig)

    monkeypatch.setattr(figure_crossmodel, "save", count)
    figures.coupling_vs_score(table, "unused", correlations=correlations)
    assert drawn and not any(n for n, _ in drawn.values())  # no claims table: no line anywhere
    excess = table[table["family"] == "fixed_size"]
    r = np.corrcoef(excess["coupling_excess"], excess["score"])[0, 1]
    analyses = pd.DataFrame(
        dict(
            analysis=["fixed_size_excess_vs_bpb"],
            estimate=[np.sign(r) * 0.3],
            ci_low=[np.nan],
            ci_high=[np.nan],
            unit=["run"],
            n=[4],
            p=[0.01],
            p_wild=[0.02],
            p_holm=[np.nan],
            note=[""],
        )
    )
    claims = claims_module.claims_table(analyses, {})
    figures.coupling_vs_score(table, "unused", correlations=correlations, claims=claims)
    lines = {key: n for key, (n, _) in drawn.items() if n}
    assert lines == {(0, "calibrated"): 1}, drawn
    overlap = next(title for (col, x), (_, title) in drawn.items() if col == 0 and x != "raw"
                   and x != "calibrated")  # fmt: skip
    assert "no line: no claims row of its own" in overlap, overlap
    raw = drawn[(0, "raw")][1]
    assert "no line: its claims rows have no estimate" in raw, raw
    other = [title for (col, _), (_, title) in drawn.items() if col == 1]
    assert all("no fit: these models are not one design" in t for t in other), other


def test_vit_accuracy_legends_clear_the_axis_labels(tmp_path, monkeypatch):
    """The default run's own ViT tables (tests/data/vit_default, from the run at 7971d9e: five
    rates of four seeds, so a least-squares line and legend entry per rate under each panel):
    the legends once sat over the two-line x labels."""
    from blockcoupling.figures import vit as figure_vit

    found = []

    def checked_save(fig, path):  # common.save, its layout checked where it was fixed
        found.extend(layout_problems(fig))
        return common.write(fig, path)

    monkeypatch.setattr(figure_vit, "save", checked_save)
    data = Path(__file__).parent / "data" / "vit_default"
    table = pd.read_csv(data / "vit_models.csv")
    within = pd.read_csv(data / "vit_coupling_vs_accuracy.csv")
    assert_written(figure_vit.vit_coupling_vs_accuracy(table, tmp_path / "acc.png", within=within))
    assert not found, "; ".join(found)


def test_vit_accuracy_lines_are_the_claims_rows_within_rate_slope(monkeypatch):
    """vit_coupling_vs_accuracy drew a least-squares line per rate in every panel from the
    per-rate correlation table (analysis rows), none from the claim's row: its lines are now
    the claims row's slope (accuracy per sd of the excess, rate and seed as blocks) through
    each rate's mean, in the excess panel alone, checked against statsmodels' fixed-effects
    OLS on the raw measure; the other panels say why they have none."""
    import statsmodels.formula.api as smf

    from blockcoupling.figures import vit as figure_vit
    from blockcoupling.stats import claims as claims_module
    from blockcoupling.stats import vit as stats_vit

    data = Path(__file__).parent / "data" / "vit_default"
    table = pd.read_csv(data / "vit_models.csv")
    within = pd.read_csv(data / "vit_coupling_vs_accuracy.csv")
    claims = claims_module.claims_table(stats_vit.vit_analyses(table), {})
    panels: dict[str, tuple[list, str]] = {}

    def count(fig, path):
        for ax in fig.axes:
            if ax.get_ylabel() == "test accuracy":
                fits = [line for line in ax.lines if len(line.get_xdata()) == 2]
                panels[ax.get_xlabel().split(" ")[0]] = (fits, ax.get_title())
        plt.close(fig)

    monkeypatch.setattr(figure_vit, "save", count)
    figure_vit.vit_coupling_vs_accuracy(table, "unused", within=within)
    assert panels and not any(fits for fits, _ in panels.values())  # no claims: no line
    figure_vit.vit_coupling_vs_accuracy(table, "unused", within=within, claims=claims)
    fe = smf.ols("test_accuracy ~ coupling_excess + C(sd) + C(seed)", data=table).fit()
    drawn = {key: fits for key, (fits, _) in panels.items() if fits}
    assert list(drawn) == ["calibrated"], panels
    fits = drawn["calibrated"]
    assert len(fits) == table["sd"].nunique()
    for line in fits:
        (x0, x1), (y0, y1) = line.get_xdata(), line.get_ydata()
        assert (y1 - y0) / (x1 - x0) == pytest.approx(fe.params["coupling_excess"], rel=1e-6)
    assert "lines: the claim's slope" in panels["calibrated"][1]
    others = [title for key, (_, title) in panels.items() if key != "calibrated"]
    assert others and all("no line: no claims row rests on this measure" in t for t in others)


# the shapes of a default run: 20 fixed-size runs with long names (the design before issue 41's;
# config/across_runs.yaml has 52) beside 2 pretrained models, and metrics.ks [4, 8, 10, 30, 50]
DEFAULT_MODELS = [
    f"fixed_size-f{f}-wd{w}-s{s}-final"
    for f in (0.02, 0.06, 0.2, 1.0)
    for w in (0.0, 1.0)
    for s in (2, 3)
] + [f"fixed_size-f0.06-lr{lr}-s{s}-final" for lr in (0.0007, 0.006) for s in (2, 3)]
DEFAULT_MODELS += ["smollm2-135m", "gemma3-270m"]


def k_sweep_table(ks=(4, 8, 10, 30, 50)) -> pd.DataFrame:
    """A stats.k_sweep table of two subsets and two methods over ``ks``."""
    rng = np.random.default_rng(5)
    rows = [
        dict(subset=subset, k=k, method=method, r=r, ci_low=r - 0.3, ci_high=r + 0.2, n=n)
        for subset, n in (("all", 22), ("family:fixed_size", 20))
        for method in ("pearson", "spearman")
        for k in ks
        for r in [float(rng.uniform(-0.6, 0.6))]
    ]
    return pd.DataFrame(rows)


def test_the_default_runs_shapes_lay_out_cleanly(tmp_path, monkeypatch):
    """coupling_vs_score with the default's 22 models (at 4d19738 its legend title "model" sat
    over the x label "(chance = K/d)") and k_sweep_curve at the default's K (its ticks 8 and 10
    read "810"): no overlap and no tick labels that run together."""
    found = []

    def checked_save(fig, path):  # common.save, its layout checked where it was fixed
        found.extend(layout_problems(fig))
        return common.write(fig, path)

    monkeypatch.setattr(figure_crossmodel, "save", checked_save)
    families = ["fixed_size"] * 20 + ["SmolLM2", "Gemma-3"]
    ds = make_coupling(DEFAULT_MODELS).assign_coords(family=("model", families))
    table = with_calibration(
        crossmodel.model_table(crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=20)))
    )
    correlations = crossmodel.correlations(
        table,
        predictors=("coupling", "coupling_excess", "overlap_u"),
        subsets=crossmodel.table_subsets(table),
    )
    assert_written(figures.coupling_vs_score(table, tmp_path / "score", correlations=correlations))
    assert not found, "coupling_vs_score: " + "; ".join(found)
    assert_written(figures.k_sweep_curve(k_sweep_table(), tmp_path / "sweep"))
    assert not found, "k_sweep_curve: " + "; ".join(found)


def test_depth_heatmaps_draw_a_shared_twin_once_and_state_k(monkeypatch):
    """The fixed-size runs share one random-init twin: drawn once (it was drawn 20 times in the
    default run), titled with how many models share it; the title states K."""
    ds = make_coupling(MANY)
    twin = ds["depth_mis"].sel(init="random").isel(model=0)
    ds["depth_mis"].loc[dict(init="random")] = twin.broadcast_like(
        ds["depth_mis"].sel(init="random")
    ).transpose(*ds["depth_mis"].sel(init="random").dims)
    found = {}

    def keep(fig, path):
        found["images"] = sum(len(ax.images) for ax in fig.axes)
        found["titles"] = [ax.get_title() for ax in fig.axes]
        found["suptitle"] = fig._suptitle.get_text() if fig._suptitle else ""
        plt.close(fig)
        return []

    monkeypatch.setattr(figures.heatmaps, "save", keep)
    figures.depth_heatmaps(core.select(ds["depth_mis"], **SEL), "unused")
    assert found["images"] == len(MANY) + 1, found
    assert sum("shared by 5 models" in t for t in found["titles"]) == 1, found["titles"]
    assert "K = 10" in found["suptitle"], found["suptitle"]


def test_axis_labels_print_symbols_in_mathtext_not_underscores():
    """Every axis label of a known column, and the heatmaps' colour bar, print their symbols in
    mathtext: no literal underscore outside $...$ ("U_l", "m_K" once printed as typed)."""
    texts = [common.label(column) for column in common.LABELS] + [common.MIS_LABEL]
    plain = [re.sub(r"\$[^$]*\$", "", text) for text in texts]
    assert not [t for t, p in zip(texts, plain) if "_" in p], texts


def test_hyperparameter_panels_show_only_estimated_correlations(registered, monkeypatch):
    """The default run's panel of the fixed-size grid was mostly "n/a" (depth, width and size
    are constant there): a subset without any r has no panel, and no bar is an "n/a"."""
    titles, texts = [], []

    def keep(fig, path):
        titles.extend(ax.get_title() for ax in fig.axes)
        texts.extend(t.get_text() for ax in fig.axes for t in ax.texts)
        plt.close(fig)
        return []

    monkeypatch.setattr(figure_crossmodel, "save", keep)
    source, tables, options = registered["many"]["hyperparameter_correlations"]
    corr = pd.read_csv(source)
    empty = [s for s, rows in corr.groupby("subset") if rows["r"].isna().all()]
    assert empty  # the case at hand: subsets without any estimate
    figures.render("hyperparameter_correlations", source, "unused", tables=tables, **options)
    assert titles and not any(title.startswith(tuple(empty)) for title in titles), titles
    assert "n/a" not in texts


def test_block_colours_are_one_per_block_drawn_with_regular_ticks(monkeypatch):
    """A 4-block model beside a 30-block one in the combined spectra (NaN past its depth): its
    spectra figure had a 1-30 colour scale, its four lines one colour. Now one colour per block
    it has, a tick on each."""
    ds = make_spectra(["small", "large"]).reindex(layer=np.arange(1, 31))
    found = {}

    def keep(fig, path):
        bar = next(ax for ax in fig.axes if ax.get_ylabel() == "block $l$")
        found["ticks"] = [float(t) for t in bar.get_yticks()]
        found["colours"] = {
            tuple(np.round(line.get_color(), 3)) for ax in fig.axes[:2] for line in ax.lines
        }
        plt.close(fig)
        return []

    monkeypatch.setattr(figures.trajectories, "save", keep)
    figures.singular_value_spectra(ds, "unused", model="small")
    assert found["ticks"] == [1.0, 2.0, 3.0, 4.0], found
    assert len(found["colours"]) == LAYERS, found


def test_colour_bar_steps_are_spaced_so_their_labels_cannot_collide():
    """coupling_vs_validation_loss labelled every one of the default's 9 checkpoint steps on its
    colour bar (log10(step + 1)): 384, 512, 768 and 1000 printed over each other. Ticks are now
    at least 1/8 of the span apart, the first and the final step kept."""
    from blockcoupling.figures.checkpoints import spaced

    ticks = np.log10(np.array([0, 16, 64, 128, 256, 384, 512, 768, 1000]) + 1)
    kept = spaced(ticks)
    assert kept[0] == ticks[0] and kept[-1] == ticks[-1]
    assert np.diff(kept).min() >= (ticks[-1] - ticks[0]) / 8
    assert np.diff(ticks).min() < (ticks[-1] - ticks[0]) / 8  # the case it guards


def test_every_measure_panel_of_coupling_vs_validation_loss_quotes_its_row(registered, monkeypatch):
    """The excess panel said "no row in the statistics table": checkpoint_correlations had rows
    for the raw and adjacent coupling only. Every measure drawn now has its combined row."""
    text = " ".join(figure_texts("coupling_vs_validation_loss", registered, monkeypatch))
    assert "no row in the statistics table" not in text, text
    assert text.count("mean within-run r") >= 2, text
