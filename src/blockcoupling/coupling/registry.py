"""The one registry of per-pair coupling measures (torch-free).

Each entry names a measure once: the variable suffix it is stored under (``depth_<name>`` for the
depth-wise family, ``<family>_<name>`` for the token families), how it is computed from the
stored sufficient statistics (a function of :class:`PairStats`), its no-effect level (a function
too), its unit, description, labels and whether the statistics tabulate it (docs/datasets.md
holds the table ``docs_table`` makes of them: ``blockcoupling docs docs/datasets.md`` writes it,
a test fails while it is stale). ``metrics`` computes every registered measure for the
depth-wise and token families and the summaries over block pairs; ``files.combine``,
``vit.results``, the statistics' tables (``stats.core.CALIBRATED``, ``NULLS``), the designed
tests' ids, the figures' rows and labels, the report's captions and the NetCDF long names all
read this table. Adding a measure: one entry here (its functions included), its test against an
independent computation, the docs table rewritten by the command above, and a figure only if it
needs its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xarray as xr


@dataclass(frozen=True)
class PairStats:
    """What a family's measures are computed from, all for one file.

    ``mis``: raw m_K ``(reading, norm, k, variant, prompt, layer, layer_ref, *tokens)``;
    ``null``: its spectrum-matched null for each ``J_i`` (no ``layer_ref``/``variant``/reference
    token dims); ``ucorner``, ``vcorner``: cumulative corner sums of squares of ``U_i^T U_j``,
    ``V_i^T V_j`` ``(prompt, layer, layer_ref, *tokens, k)`` with ``k`` = 1..K_max; ``ks``: the K
    list; ``d``: the hidden size.
    """

    mis: xr.DataArray
    null: xr.DataArray
    ucorner: xr.DataArray | None  # None where extraction stored no basis corners
    vcorner: xr.DataArray | None
    ks: Sequence[int]
    d: int


def _overlap(corner: xr.DataArray, ks: Sequence[int]) -> xr.DataArray:
    """``||B_i,K^T B_j,K||_F^2 / K`` at every K of ``ks`` from the corner sums of ``B_i^T B_j``."""
    k = xr.DataArray(list(ks), dims="k", coords={"k": list(ks)})
    return corner.sel(k=list(ks)) / k


@dataclass(frozen=True)
class Measure:
    """One per-pair measure, stored as ``depth_<name>`` / ``<family>_<name>``.

    ``compute`` and ``chance`` (its no-effect level, a DataArray broadcastable against it or a
    constant) are functions of the family's :class:`PairStats`. The depth-wise ``summary`` is
    its per-prompt mean over block pairs l != l' (times ``sign``: raw coupling is minus the mean
    m_K, larger = more coupled), ``adjacent`` the same over |l - l'| = 1, and ``summary_chance``
    the summary's chance level: the name of the metrics variable that holds it (the mean of
    ``chance`` over blocks, times ``sign``) or a constant. ``tabulated`` summaries are the
    statistics' measures (tables, figures, designed tests), ``key`` their name in analysis ids,
    ``caption`` their name in the report's captions (which list them by ``caption_list``).
    ``dims``: the dims of its depth-wise variable (docs/datasets.md's table; the metrics' test
    checks them). ``adjacent_long_name`` and ``chance_long_name``: the NetCDF long names of the
    adjacent summary and of the chance variable (``files.cf``; defaults name the summary),
    ``chance_description``: the chance variable's ``description`` attr (the first entry that
    holds a shared chance variable describes it).
    """

    name: str
    compute: Callable[[PairStats], xr.DataArray]
    chance: Callable[[PairStats], xr.DataArray | float]
    null_level: str
    unit: str
    description: str
    summary: str | None = None
    sign: int = 1
    adjacent: str | None = None
    summary_chance: str | float | None = None
    summary_description: str = ""
    label: str = ""
    short_label: str = ""
    caption: str = ""
    tabulated: bool = False
    key: str = ""
    dims: tuple[str, ...] = ("reading", "norm", "k", "variant", "prompt", "layer", "layer_ref")
    adjacent_long_name: str = ""
    chance_long_name: str = ""
    chance_description: str = ""
    reads_bases: bool = False  # computed from ``ucorner``/``vcorner`` (absent: not computed)


MEASURES: tuple[Measure, ...] = (
    Measure(
        "mis",
        lambda s: s.mis,
        lambda s: s.null,
        "its spectrum-matched null (``null``): m_K of J_i in Haar-random bases",
        "dimensionless (0 = J_i diagonal in J_j's basis)",
        "m_K(J_i, J_j), the authors' mis-coupling (science.md); lower = more coupled",
        summary="coupling",
        sign=-1,
        adjacent="adjacent_coupling",
        summary_chance="coupling_null",
        summary_description="coupling: minus the mean m_K over block pairs l != l'",
        label="raw coupling (−mean m_K over l≠l')",
        short_label="coupling",
        caption="raw coupling",
        tabulated=True,
        key="coupling",
        adjacent_long_name="adjacent coupling: minus the mean m_K over |l - l'| = 1",
        chance_long_name="coupling at chance: minus the mean null of m_K over l != l'",
        chance_description="what coupling is at chance (minus the mean null)",
    ),
    Measure(
        "excess",
        lambda s: s.null - s.mis,
        lambda s: 0.0,
        "0 (no more coupled than unrelated bases with J_i's own spectrum)",
        "same as m_K",
        "the null of m_K for J_i minus m_K(J_i, J_j); > 0 = more coupled than chance",
        summary="coupling_excess",
        adjacent="adjacent_excess",
        summary_chance=0.0,
        summary_description="coupling excess: mean (null - m_K) over l != l' (0: chance)",
        label="calibrated excess (null − m_K; > 0 = above chance)",
        short_label="excess",
        caption="calibrated excess",
        tabulated=True,
        key="excess",
        adjacent_long_name="adjacent coupling excess: mean (null - m_K) over |l - l'| = 1",
    ),
    Measure(
        "overlap_u",
        lambda s: _overlap(s.ucorner, s.ks),
        lambda s: chance_overlap(s.ks, s.d),
        "K/d (Haar-random K-dimensional subspaces)",
        "fraction in [0, 1] (1 = the same top-K left singular subspace)",
        "||U_{i,K}^T U_{j,K}||_F^2 / K, overlap of the top-K left singular subspaces",
        summary="overlap_u",
        summary_chance="overlap_null",
        summary_description="mean top-K left singular subspace overlap over l != l'",
        label="overlap ‖U_lᵀU_l'‖²_F / K (chance = K/d)",
        short_label="overlap",
        caption="overlap",
        tabulated=True,
        key="overlap_u",
        dims=("prompt", "layer", "layer_ref", "k"),
        chance_long_name="subspace overlap at chance: K/d",
        chance_description="K/d: the overlap of unrelated subspaces",
        reads_bases=True,
    ),
    Measure(
        "overlap_v",
        lambda s: _overlap(s.vcorner, s.ks),
        lambda s: chance_overlap(s.ks, s.d),
        "K/d (Haar-random K-dimensional subspaces)",
        "fraction in [0, 1] (1 = the same top-K right singular subspace)",
        "||V_{i,K}^T V_{j,K}||_F^2 / K, overlap of the top-K right singular subspaces",
        summary="overlap_v",
        summary_chance="overlap_null",
        summary_description="mean top-K right singular subspace overlap over l != l'",
        label="overlap ‖V_lᵀV_l'‖²_F / K (chance = K/d)",
        short_label="overlap V",
        caption="overlap of the right singular subspaces",
        key="overlap_v",
        dims=("prompt", "layer", "layer_ref", "k"),
        reads_bases=True,
    ),
)
RAW = "mis"  # the authors' measure, whose summary is raw coupling
PRIMARY = "excess"  # the measure of the designed tests' unsuffixed ids (config stats.primary)


def measure(name: str) -> Measure:
    """The registered measure of that name."""
    for entry in MEASURES:
        if entry.name == name:
            return entry
    raise KeyError(f"no per-pair measure {name!r} (registered: {[m.name for m in MEASURES]})")


def chance_overlap(ks: Sequence[int], d: int) -> xr.DataArray:
    """K/d for every K of ``ks``: the overlap of unrelated K-dimensional subspaces, dims (k)."""
    return xr.DataArray([k / d for k in ks], dims="k", coords={"k": list(ks)})


def shown() -> tuple[Measure, ...]:
    """The tabulated measures, raw first (figures, the calibration table)."""
    return tuple(m for m in MEASURES if m.tabulated)


def calibrated() -> tuple[Measure, ...]:
    """The tabulated measures other than raw coupling, in registry order."""
    return tuple(m for m in shown() if m.name != RAW)


def tested() -> tuple[Measure, ...]:
    """The tabulated measures in the designed tests' order: the primary first, raw last."""
    rest = [m for m in calibrated() if m.name != PRIMARY]
    return (measure(PRIMARY), *rest, measure(RAW))


def primary_first() -> tuple[Measure, ...]:
    """The tabulated measures, the primary first, then raw first as in ``shown`` (the ViT
    sweep's designed tests).
    """
    return (measure(PRIMARY), *(m for m in shown() if m.name != PRIMARY))


def test_suffix(entry: Measure) -> str:
    """The suffix of ``entry``'s designed-test ids: none for the primary measure, else its key
    (``vit_sd_effect`` is the primary measure's test, ``vit_sd_effect_coupling`` raw coupling's).
    """
    return "" if entry.name == PRIMARY else f"_{entry.key}"


def caption_list() -> str:
    """The tabulated measures as the report's captions list them (rst): each one's caption
    name, what its summary is and its no-effect level, in registry order; the workflow hands it
    to the captions as ``config["report_measures"]``.
    """
    return "; ".join(
        f"{m.caption} ({m.summary_description}; no effect: {m.null_level})" for m in shown()
    )


def summary_variables() -> tuple[str, ...]:
    """Every per-prompt summary the metrics write over block pairs: the summaries, their
    adjacent versions and the chance levels held in variables, each once, in registry order.
    """
    names = []
    for m in MEASURES:
        names += [n for n in (m.summary, m.adjacent, m.summary_chance) if isinstance(n, str)]
    return tuple(dict.fromkeys(names))


def summary_long_names() -> dict[str, str]:
    """The NetCDF long name of every per-prompt summary variable (``summary_variables``): the
    summary's description, the adjacent one's and the chance level's long names (defaults name
    the summary), the first entry naming a variable giving its text.
    """
    names: dict[str, str] = {}
    for m in MEASURES:
        if m.summary:
            names.setdefault(m.summary, m.summary_description or m.summary)
        if m.adjacent:
            names.setdefault(m.adjacent, m.adjacent_long_name or f"{m.summary} over |l - l'| = 1")
        if isinstance(m.summary_chance, str):
            names.setdefault(m.summary_chance, m.chance_long_name or f"{m.summary} at chance")
    return names


def chance_descriptions() -> dict[str, str]:
    """Chance-level variable -> its ``description`` attr (the first entry naming one that
    describes it).
    """
    out: dict[str, str] = {}
    for m in MEASURES:
        if isinstance(m.summary_chance, str) and m.chance_description:
            out.setdefault(m.summary_chance, m.chance_description)
    return out


DOCS_START, DOCS_END = "<!-- measures:start -->", "<!-- measures:end -->"


def docs_table() -> str:
    """The Markdown tables of every registered measure (docs/datasets.md, between the markers):
    its variables and their dims, what it is, its no-effect level and unit; then every
    per-prompt summary over block pairs (``summary_variables``) with its long name.
    """
    rows = [
        "| variables (depth / token family) | depth dims | what it is | no-effect level | unit |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in MEASURES:
        names = f"`depth_{m.name}`, `{{family}}_{m.name}`"
        cells = (names, f"`({', '.join(m.dims)})`", m.description, m.null_level, m.unit)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    rows += ["", "| per-prompt summary over block pairs | what it is |", "| --- | --- |"]
    for name, long_name in summary_long_names().items():
        rows.append(f"| `{name}` | " + long_name.replace("|", "\\|") + " |")
    return "\n".join(rows)
