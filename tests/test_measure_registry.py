"""The measure registry (blockcoupling.coupling.registry) is the single source of every per-pair
measure: a measure added there reaches the metrics, the ViT grid dataset, the statistics' lists, the
designed tests' ids, the figures' rows and labels, the report's captions and the NetCDF long
names, with no other edit; the docs' table of measures is the registry's."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

from blockcoupling.coupling import registry as measures
from blockcoupling.figures import FIGURES
from blockcoupling.figures import common as figure_common
from blockcoupling.stats import calibration, core, fixed_size

# A measure that only the registry knows, named so that no real measure takes its names: |cos| of
# the top-1 left singular vectors of J_i and J_j (sqrt of the K = 1 corner sum of U_i^T U_j),
# tabulated, with its chance level E|cos| of unrelated unit vectors in d dimensions.
PROBE = """
import json, math, sys
import xarray as xr
from blockcoupling.coupling import registry as measures

def chance(s):
    return math.exp(math.lgamma(s.d / 2) - math.lgamma((s.d + 1) / 2)) / math.sqrt(math.pi)

measures.MEASURES = (*measures.MEASURES, measures.Measure(
    "probe_cos", lambda s: s.ucorner.sel(k=1, drop=True) ** 0.5, chance,
    "E|cos| of unrelated unit vectors", "1", "|cos| of the top-1 left singular vectors",
    summary="probe", summary_chance="probe_null", summary_description="mean |cos|",
    label="top-1 cosine", short_label="cos", caption="top-1 cosine", tabulated=True,
    key="probe", dims=("prompt", "layer", "layer_ref")))

from blockcoupling.files import cf
from blockcoupling.files.io import write_netcdf
from blockcoupling.coupling import finite, metrics
from blockcoupling.figures import common
from blockcoupling.jacobians.extract import ExtractConfig, extract
from blockcoupling.stats import calibration, core, fixed_size, hypotheses
sys.path.insert(0, sys.argv[1])
written = sys.argv[2]
from tiny_models import ARCHITECTURES, CharTokenizer

config = ExtractConfig(k_max=4, token_layers=(-1,), token_prompts=1, store_factors=True)
model, tokenizer = ARCHITECTURES["llama"](), CharTokenizer()
depth = extract(model, tokenizer, ["hello"], config, progress=False)["depth"]
ds = metrics.coupling_dataset(depth, metrics.MetricConfig(ks=(1, 2), null_draws=16))
u = depth["u"].isel(prompt=0).transpose("layer", "dim", "rank").values
write_netcdf(ds, written)
with xr.open_dataset(written) as back:
    labels = {n: (back[n].attrs["long_name"], back[n].attrs["units"])
              for n in ("depth_probe_cos", "probe", "probe_null")}
print(json.dumps({
    "metrics": sorted(ds.data_vars),
    "calibrated": list(core.CALIBRATED),
    "nulls": list(core.NULLS),
    "predictors": list(fixed_size.PREDICTORS),
    "ids": [i for i in hypotheses.HYPOTHESES if "probe" in i],
    "figure_measures": {k: v for k, v in common.MEASURES.items() if isinstance(v, str)},
    "label": common.LABELS.get("probe"),
    "calibration_columns": list(calibration.COLUMNS),
    "labels": labels,
    "dims": {m.name: [list(m.dims), list(ds[f"depth_{m.name}"].dims)] for m in measures.MEASURES},
    "guarded": list(finite.SUMMARIES),
    "cos": float(ds["depth_probe_cos"].isel(prompt=0, layer=0, layer_ref=1)),
    "direct": abs(float(u[0, :, 0] @ u[1, :, 0])),
    "captions": measures.caption_list(),
}))
"""


def test_a_measure_added_to_the_registry_reaches_every_consumer(tmp_path: Path) -> None:
    """The top-1 cosine, added by one registry entry in a fresh interpreter, is computed by the
    metrics (against the stored singular vectors themselves) with the dims its entry declares,
    written to NetCDF with the long names of its variable, its summary and its chance level,
    guarded against NaN, tabulated, tested, labelled and
    captioned."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(Path(__file__).parent), str(tmp_path / "coupling.nc")],
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(out.stdout)
    assert {"depth_probe_cos", "probe", "probe_null"} <= set(seen["metrics"])
    assert {"probe", "probe_null", "overlap_u", "overlap_v"} <= set(seen["guarded"])
    assert seen["calibrated"][-1] == "probe" and seen["nulls"][-1] == "probe_null"
    assert "probe" in seen["predictors"]
    assert "fixed_size_probe_vs_bpb" in seen["ids"] and "vit_sd_effect_probe" in seen["ids"]
    assert seen["figure_measures"]["probe"] == "probe_null"
    assert seen["label"] == "top-1 cosine"
    assert seen["calibration_columns"][-4:-2] == ["probe", "probe_null"]
    assert seen["labels"] == {
        "depth_probe_cos": ["depth-wise: |cos| of the top-1 left singular vectors", "1"],
        "probe": ["mean |cos|", "1"],
        "probe_null": ["probe at chance", "1"],
    }
    for name, (declared, computed) in seen["dims"].items():
        assert declared == computed, name
    assert (
        "top-1 cosine (mean |cos|; no effect: E|cos| of unrelated unit vectors)" in seen["captions"]
    )
    assert abs(seen["cos"] - seen["direct"]) < 1e-5 * max(1.0, seen["direct"])


def test_the_derived_lists_are_the_registry_s() -> None:
    shown = [m.summary for m in measures.shown()]
    assert shown[0] == "coupling" and list(figure_common.MEASURES) == shown
    assert core.CALIBRATED == tuple(shown[1:])
    assert list(fixed_size.PREDICTORS)[0] == measures.measure(measures.PRIMARY).summary
    assert set(fixed_size.PREDICTORS) == set(shown)
    for name in shown:
        assert name in calibration.COLUMNS and figure_common.LABELS[name]


def test_every_measure_is_documented_and_the_captions_list_the_registry_s() -> None:
    """docs/datasets.md holds the registry's table of measures; the captions of the figures with
    a row or panel per measure list them through the workflow's ``config["report_measures"]``
    (the registry's caption_list), so a new measure reaches them with no caption edited."""
    docs = (REPO / "docs" / "datasets.md").read_text(encoding="utf-8")
    start, end = docs.index(measures.DOCS_START), docs.index(measures.DOCS_END)
    assert docs[start + len(measures.DOCS_START) : end].strip() == measures.docs_table(), (
        "docs/datasets.md's measure table is stale: blockcoupling docs docs/datasets.md"
    )
    for entry in measures.MEASURES:
        assert f"`depth_{entry.name}`" in measures.docs_table()
    listing = {name for name in FIGURES if 'config["report_measures"]' in _caption(name)}
    assert listing == {
        "coupling_vs_score",
        "coupling_vs_step",
        "coupling_vs_validation_loss",
        "vit_coupling_vs_sd",
        "vit_coupling_vs_accuracy",
    }
    snakefile = (REPO / "Snakefile").read_text(encoding="utf-8")
    assert 'config["report_measures"] = caption_list()' in snakefile
    for entry in measures.shown():
        assert f"{entry.caption} ({entry.summary_description}" in measures.caption_list()


def _caption(figure: str) -> str:
    return (REPO / "report" / f"{figure}.rst").read_text(encoding="utf-8")
