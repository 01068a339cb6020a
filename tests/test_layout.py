"""The library's layout: one subpackage per concern, imports that run one way (each package imports
only packages of lower layers), no module import cycle, and the DAG side free of torch."""

from __future__ import annotations

import ast
import graphlib
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "blockcoupling"
# Lowest first: a package may import its own modules and those of lower layers only.
LAYERS = (
    ("coupling",),  # the measures from stored statistics: numpy and xarray only
    ("files",),  # NetCDF, CF labels, combining, hashes
    ("runtime", "stats"),  # how jobs run; the statistics
    ("jacobians",),  # block Jacobians, their statistics and the adapter table
    ("lm", "vit"),  # language models (sources, hub, prompts, training); the ViT sweep: apart
    ("pipeline",),  # the workflow's side (the figure registry is plain data here)
    ("figures",),
    ("api",),  # loading a model from the command line's source forms (the flat API's)
    ("cli",),
)


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    out = {}
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports (anywhere in it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in known}


def package(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_every_package_imports_only_lower_layers_and_no_module_cycle() -> None:
    known = modules()
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    packages = {package(m) for m in known if m != "blockcoupling"}
    assert packages == set(layer), f"packages without a layer: {packages ^ set(layer)}"
    upward = []
    graph = {}
    for module, path in known.items():
        targets = imported(path, known) - {module}
        graph[module] = targets
        for target in targets:
            if (
                package(target) != package(module)
                and layer[package(target)] >= layer[package(module)]
            ):
                upward.append(f"{module} -> {target}")
    assert not upward, upward
    list(graphlib.TopologicalSorter(graph).static_order())  # CycleError names the cycle


def outside_imports_of(room: str, paths: list[Path]) -> list[str]:
    """``file: module`` for each import in ``paths`` of a module inside ``room`` (its
    ``__init__`` is the room's boundary, its modules are not)."""
    inside = {f"{room}.{p.stem}" for p in (SOURCE.parent / room.replace(".", "/")).glob("*.py")}
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found += [
                f"{path.name}: {n}"
                for n in names
                if n in inside or n.startswith(room + ".") and n.rsplit(".", 1)[0] != room
            ]
    return found


def test_the_hub_room_is_read_through_its_boundary_only() -> None:
    """Code outside ``lm/hub`` (the library, scripts, rules, Snakefile, bench) imports the hub's
    names from ``blockcoupling.lm.hub`` alone, never from its modules (fetch, cache, names,
    revisions, lock, content): the room's ``__init__`` is its stated boundary."""
    repo = SOURCE.parents[1]
    room = SOURCE / "lm" / "hub"
    outside = [p for p in SOURCE.rglob("*.py") if room not in p.parents]
    outside += [*(repo / "scripts").glob("*.py"), *(repo / "bench").glob("*.py")]
    outside += [*(repo / "rules").glob("*.smk"), repo / "Snakefile"]
    readable = [p for p in outside if p.suffix == ".py"]
    assert not outside_imports_of("blockcoupling.lm.hub", readable)
    for path in outside:  # .smk and the Snakefile are not Python: the import lines as text
        lines = path.read_text(encoding="utf-8").splitlines()
        assert not [line for line in lines if "blockcoupling.lm.hub." in line], path
    # the check can fail: a module of the room, imported from outside, is found
    assert outside_imports_of(
        "blockcoupling.lm.hub", [SOURCE.parents[1] / "tests" / "test_fetch.py"]
    )


# The DAG side: every module the Snakefile and the checks import (no torch, no matplotlib).
DAG_SIDE = (
    *(f"pipeline.{m.stem}" for m in (SOURCE / "pipeline").glob("*.py") if m.stem != "__init__"),
    "lm.sources",
    "vit.config",
    "vit.data",
    "coupling.metrics",
    "files.combine",
    "stats.core",
)
# The analysis side: the rules that read results (no torch; figures draw with matplotlib).
ANALYSIS_SIDE = (
    "coupling.formulas",
    "files.io",
    "figures",
    "lm.text.prompts",
    "runtime.runner",
    "stats.vit",
    "stats.crossmodel",
    "vit.results",
)


def test_the_dag_and_analysis_sides_import_no_torch() -> None:
    """The one test of it: the DAG side imports neither torch nor matplotlib, the analysis side
    no torch (each in a fresh interpreter)."""
    dag = "; ".join(f"import blockcoupling.{m}" for m in DAG_SIDE)
    analysis = "; ".join(f"import blockcoupling.{m}" for m in ANALYSIS_SIDE)
    code = (
        f"import sys; {dag}; "
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules, 'DAG side'; "
        f"{analysis}; assert 'torch' not in sys.modules, 'analysis side'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_param_snakemake_would_not_compare_stops_the_dag(tmp_path: Path) -> None:
    """Snakemake compares only builtin params (a typed object is silently left out, so
    changing it would re-run nothing): the workflow refuses one when it parses."""
    repo = SOURCE.parents[1]
    for name in ("Snakefile", "rules", "schemas", "config", "report", "resources", "scripts"):
        source = repo / name
        copy = shutil.copytree if source.is_dir() else shutil.copy
        copy(source, tmp_path / name)
    rules = tmp_path / "rules" / "metrics.smk"
    text = rules.read_text()
    assert "metrics=PLAN.metric," in text
    rules.write_text(text.replace("metrics=PLAN.metric,", "metrics=PLAN.extraction,"))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--quiet",
            "rules",
            "--configfile",
            "config/smoke.yaml",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0
    assert "param 'metrics' of rule metrics is a ExtractConfig" in run.stderr + run.stdout


def test_typed_params_survive_the_job_s_pickle_and_stay_read_only() -> None:
    """A job's params are pickled into its script: the typed ones come back equal."""
    import pickle

    import pytest

    from blockcoupling.coupling.metrics import MetricConfig
    from blockcoupling.stats.selection import Bootstrap, Selection

    for value in (Selection(k=4, norm="trace"), Bootstrap(n_boot=7), MetricConfig(ks=(2, 3))):
        again = pickle.loads(pickle.dumps(value))
        assert again == value and type(again) is type(value) and repr(again) == repr(value)
    with pytest.raises(TypeError, match="read-only"):
        Selection()["k"] = 3


def test_the_metrics_section_reaches_the_metric_code_by_one_route() -> None:
    """``metrics`` (``metrics.ks``, ...): the Plan's ``MetricConfig`` is passed to jobs by the
    rules of rules/metrics.smk alone, and one script hands it to the metric code."""
    root = SOURCE.parents[1]
    workflow = [root / "Snakefile", *sorted((root / "rules").glob("*.smk"))]
    passing = [p.name for p in workflow if "PLAN.metric," in p.read_text(encoding="utf-8")]
    assert passing == ["metrics.smk"], passing
    scripts = sorted((root / "scripts").glob("*.py"))
    calling = [p.name for p in scripts if "write_metrics(" in p.read_text(encoding="utf-8")]
    assert calling == ["metrics.py"], calling
