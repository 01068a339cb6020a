"""pyproject.toml declares every package the code imports (install extras included)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from conftest import REPO


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    """Every distribution of the dependencies and extras (without versions or extras)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    entries = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        entries += extra
    return {normalise(re.split(r"[<>=!~\[; ]", entry)[0]) for entry in entries}


def imported_modules() -> dict[str, str]:
    """Top-level module -> a file importing it, over the library, the rules' scripts and the
    benchmarks (imports inside functions included: ast sees them all)."""
    found: dict[str, str] = {}
    files = [*REPO.glob("src/**/*.py"), *REPO.glob("scripts/*.py"), *REPO.glob("bench/*.py")]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(REPO)))
    return found


def test_every_imported_package_is_declared() -> None:
    distributions = packages_distributions()
    wanted = declared()
    missing = []
    bench = {path.stem for path in REPO.glob("bench/*.py")}  # one benchmark imports another
    for module, where in sorted(imported_modules().items()):
        if module in sys.stdlib_module_names or module in ("blockcoupling", "__future__"):
            continue
        if module in bench and where.startswith("bench/"):
            continue
        names = {normalise(d) for d in distributions.get(module, [])}
        assert names, f"{module} (imported by {where}) is not installed"
        if not names & wanted:
            missing.append(f"{module} ({'/'.join(sorted(names))}, imported by {where})")
    assert not missing, "not declared in pyproject.toml: " + ", ".join(missing)


def test_the_extras_name_gpu_and_4bit_loading() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {"bitsandbytes", "accelerate"} <= set(extras["quantization"])
    assert "accelerate" in extras["gpu"]
    assert {"scipy", "scikit-learn", "statsmodels"} <= set(extras["workflow"])
