"""Raw coupling beside its chance level: per model, init and K, the paper's raw coupling, what it
is for unrelated bases (``coupling_null``), the calibrated excess, the overlap and its K/d, and
the Jacobians' effective rank (docs/science.md, "Calibrated coupling"), with a markdown
rendering that shows each model outside a training grid and each grid family's mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import xarray as xr

from blockcoupling.coupling import registry as measures
from blockcoupling.coupling.arguments import expect, expect_dataset, expect_ints
from blockcoupling.stats.claims import CLAIMS
from blockcoupling.stats.core import select
from blockcoupling.stats.selection import Selection

# The tabulated measures (raw first), each followed by its chance level where a variable holds it.
MEANS = tuple(
    name
    for m in measures.shown()
    for name in (m.summary, m.summary_chance)
    if isinstance(name, str)
)
COLUMNS = ("model", "family", "init", "d_model", "k", *MEANS, "effective_rank", "n_prompts")
MEASURED = (*MEANS, "effective_rank")


def _mean(values: xr.DataArray, selection: Selection) -> float:
    """The mean over prompts of ``values`` at the selection (the coordinates it has)."""
    at = select(values, **selection)
    return float(np.nanmean(at.values))


def calibration_table(
    coupling: xr.Dataset, ks: Sequence[int], selection: Selection
) -> pd.DataFrame:
    """One row per model, init and K of a combined coupling dataset: the run's
    ``results/stats/calibration.csv``.

    Parameters
    ----------
    coupling : xarray.Dataset
        A combined ``coupling.nc`` (dims ``model`` x ``init``; ``combine``).
    ks : sequence of int
        The Ks tabulated (each in the dataset's ``k``).
    selection : Selection
        The reading, variant and norm read (its K is replaced by each of ``ks``).

    Returns
    -------
    pandas.DataFrame
        Columns ``model``, ``init``, ``k``, the means over prompts of ``coupling``,
        ``coupling_null``, ``coupling_excess`` and ``overlap_u``, ``overlap_null`` (K/d), the
        median ``effective_rank`` over prompts and blocks, and the number of prompts with a
        value.

    Examples
    --------
    >>> import blockcoupling as bc
    >>> combined = bc.read_netcdf("results/combined/coupling.nc")  # doctest: +SKIP
    >>> bc.calibration_table(combined, [10, 50], bc.Selection(k=10))  # doctest: +SKIP
    """
    expect_dataset(coupling, "coupling", "calibration_table(coupling=...)")
    expect_ints(ks, "calibration_table(ks=...)")
    expect(selection, Selection, "calibration_table(selection=...)")
    missing = [dim for dim in ("model", "init") if dim not in coupling.dims]
    if missing:
        raise TypeError(
            f"calibration_table(coupling=...): expected a combined coupling dataset (dims model "
            f"and init, results/combined/coupling.nc), got one without {', '.join(missing)}; "
            "prompt_table reads one model's"
        )
    rows = []
    for model in coupling["model"].values:
        for init in coupling["init"].values:
            at = coupling.sel(model=model, init=init)
            for k in ks:
                raw = select(at["coupling"], **selection.at(k))
                if not np.isfinite(raw.values).any():
                    continue

                rows.append(
                    {
                        "model": str(model),
                        "family": str(at["family"].values) if "family" in at.coords else "",
                        "init": str(init),
                        "d_model": float(at["d_model"].values)
                        if "d_model" in at.coords
                        else np.nan,
                        "k": int(k),
                        "coupling": float(np.nanmean(raw.values)),
                        **{
                            name: _mean(at[name], selection.at(k))
                            for name in MEANS
                            if name != "coupling"
                        },
                        "effective_rank": float(np.nanmedian(at["effective_rank"].values)),
                        "n_prompts": int(np.isfinite(raw.values).sum()),
                    }
                )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def prompt_table(coupling: xr.Dataset, selection: Selection) -> pd.DataFrame:
    """The table ``blockcoupling measure`` prints: one row per prompt of one model's coupling
    dataset, and their mean.

    Parameters
    ----------
    coupling : xarray.Dataset
        ``coupling_dataset``'s output for one model (dims without ``model``/``init``).
    selection : Selection
        The K, reading, variant and norm read.

    Returns
    -------
    pandas.DataFrame
        Indexed by prompt id, plus a last row ``mean``: the ``MEANS`` of ``calibration_table``
        (raw coupling, its chance level, the excess, overlap U, K/d; dimensionless) and
        ``effective_rank``, the median over blocks (over prompts and blocks in the mean row).

    Examples
    --------
    >>> import blockcoupling as bc
    >>> table = bc.prompt_table(coupling, bc.Selection(k=10))  # doctest: +SKIP
    >>> table.loc["mean", "coupling_excess"]  # doctest: +SKIP
    """
    expect_dataset(coupling, "coupling", "prompt_table(coupling=...)")
    expect(selection, Selection, "prompt_table(selection=...)")
    several = [dim for dim in ("model", "init", "step") if dim in coupling.dims]
    if several:
        raise TypeError(
            f"prompt_table(coupling=...): expected one model's coupling dataset, got one with "
            f"dims {', '.join(several)}; select one, e.g. coupling.sel(model=..., init=...)"
        )
    frame = pd.DataFrame(
        {
            name: np.broadcast_to(
                select(coupling[name], **selection).values, coupling.sizes["prompt"]
            )
            for name in MEANS
        },
        index=pd.Index([str(p) for p in coupling["prompt"].values], name="prompt"),
    )
    rank = coupling["effective_rank"].transpose("prompt", "layer").values
    frame["effective_rank"] = np.nanmedian(rank, axis=1)
    mean = frame.mean().to_frame("mean").T
    mean["effective_rank"] = float(np.nanmedian(rank))
    return pd.concat([frame, mean])


def calibration_markdown(table: pd.DataFrame, grids: Sequence[str]) -> str:
    """``table`` as markdown: every model outside the training-grid families ``grids`` on its
    own rows, each grid family as the mean (and range of the excess) over its models.
    """
    lines = [
        "Raw coupling (the paper's: minus the mean m_K over block pairs, authors' reading) beside "
        "its chance level for unrelated bases (`coupling_null`), the calibrated excess (0 = "
        "chance, > 0 = more coupled), the top-K subspace overlap and its chance level K/d, and "
        "the median effective rank of the block Jacobians (`results/stats/calibration.csv`).",
        "",
        "| model | init | d | K | raw coupling | chance | excess | overlap U | K/d | eff. rank |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def cells(label: str, part: pd.DataFrame) -> str:
        excess = part["coupling_excess"]
        spread = (
            f" [{excess.min():.3f}, {excess.max():.3f}]" if len(part) > 1 else ""
        )  # the range over the family's models
        values = [
            label,
            str(part["init"].iloc[0]),
            f"{part['d_model'].mean():.0f}",
            str(int(part["k"].iloc[0])),
            f"{part['coupling'].mean():.3f}",
            f"{part['coupling_null'].mean():.3f}",
            f"{excess.mean():+.3f}{spread}",
            f"{part['overlap_u'].mean():.3f}",
            f"{part['overlap_null'].mean():.3f}",
            f"{part['effective_rank'].median():.1f}",
        ]
        return "| " + " | ".join(values) + " |"

    single = table[~table["family"].isin(grids)]
    for _, part in single.groupby(["model", "init", "k"], sort=True):
        lines.append(cells(str(part["model"].iloc[0]), part))
    for (family, _, _), part in table[table["family"].isin(grids)].groupby(
        ["family", "init", "k"], sort=True
    ):
        runs = f"{len(part)} run" + ("s" if len(part) != 1 else "")
        # runs whose models are one and the same (a shared random-init twin) give equal rows
        distinct = len(part.drop_duplicates(subset=list(MEASURED)))
        if distinct < len(part):
            runs += f", {distinct} distinct model" + ("s" if distinct != 1 else "")
        lines.append(cells(f"{family} ({runs}, mean [range])", part))
    return "\n".join(lines) + "\n"


def rank_warnings(table: pd.DataFrame, k: int, key: str = "stats.k") -> dict[str, str]:
    """Per family of trained models (a model outside any family: by its name) whose median
    effective rank is below ``k``: a warning naming ``key``. With K above the rank the top-K
    bases hold directions the Jacobian barely uses, and m_K counts the other block's energy
    there (off the diagonal of A) as mis-coupling: the excess then follows the spectrum's shape.
    """
    rows = table[(table["init"] == "trained") & (table["k"] == k)]
    out = {}
    for label, part in rows.groupby(rows["family"].where(rows["family"] != "", rows["model"])):
        below = part[part["effective_rank"] < k]
        if len(below):
            out[str(label)] = (
                f"{key} = {k} is above the median effective rank of {len(below)} of {len(part)} "
                f"trained model(s) here (lowest {below['effective_rank'].min():.1f}): their excess "
                "partly measures the spectrum's shape (docs/science.md, 'Which K')"
            )
    return out


def checkpoint_rank_warning(table: pd.DataFrame, k: int, key: str = "stats.k") -> str | None:
    """A warning naming ``key`` when ``k`` is above the median effective rank of some run of a
    checkpoint table (``checkpoints.checkpoint_table``: model, step, effective_rank) at some
    step: the runs, the steps and the lowest rank; None when no checkpoint is below ``k`` (or
    the table has no ranks).
    """
    if "effective_rank" not in table:
        return None
    below = table[table["effective_rank"] < k]
    if not len(below):
        return None
    steps = ", ".join(str(int(s)) for s in sorted(below["step"].unique()))
    return (
        f"{key} = {k} is above the median effective rank of {below['model'].nunique()} of "
        f"{table['model'].nunique()} checkpoint run(s) at step(s) {steps} (lowest "
        f"{below['effective_rank'].min():.1f}): their excess there partly measures the "
        "spectrum's shape (docs/science.md, 'Which K')"
    )


def rank_flags(
    frame: pd.DataFrame | None, suites: pd.DataFrame | None, k: int
) -> tuple[dict[str, str], dict[str, str]]:
    """The K-above-rank warnings of a run and the claims they flag: (analysis id -> warning,
    label -> warning). ``frame``: the calibration table (``calibration_table``; its fixed-size
    family flags the fixed-size and token claims); ``suites``: the checkpoint table (its
    warning flags every emergence claim). Either may be None (not in the design).
    """
    warnings = rank_warnings(frame, k) if frame is not None else {}
    flags = {}
    for claim in CLAIMS:
        if claim.analysis.split("_")[0] in ("fixed", "tokens") and "fixed_size" in warnings:
            flags[claim.analysis] = warnings["fixed_size"]
    warning = checkpoint_rank_warning(suites, k) if suites is not None else None
    if warning:
        warnings["checkpoint suites"] = warning
        flags |= {c.analysis: warning for c in CLAIMS if c.analysis.startswith("emergence")}
    return flags, warnings
