"""Provenance stamps of the figures, and the documentation's figures (docs/figures/*.png).

Every figure the workflow draws carries a stamp in its PNG text chunks (scripts/figure.py,
``figure_stamp.stamp_png``): the commit it was made at, the hash of the run's config and the
hash of the code that draws it (``design``: the modules scripts/figure.py imports,
``code_hash``). ``blockcoupling docs --figures RUN`` copies ``DOCS_FIGURES`` from a finished
default run into docs/figures, stamps and all; ``stale`` names a docs figure whose stamp is
missing or whose config or design is not the current one (tests/test_docs_figures.py fails on
it).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from blockcoupling.pipeline.code_hash import code_hash
from blockcoupling.pipeline.figure_stamp import COMMIT, CONFIG, DESIGN

DOCS_FIGURES = (
    "coupling_vs_step",
    "depth_heatmaps",
    "vit_coupling_vs_sd",
    "vit_coupling_vs_accuracy",
)
REPO = Path(__file__).resolve().parents[3]
FIGURE_SCRIPT = REPO / "scripts" / "figure.py"


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 (12 hex digits) of a config as JSON with sorted keys (the workflow's ``config``
    and the same file read with yaml give the same).
    """
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def file_config_hash(path: str | Path) -> str:
    """``config_hash`` of a config file as the workflow reads it: the schema's defaults filled
    in (``schema_check.validate_config``).
    """
    import yaml

    from blockcoupling.pipeline.schema_check import validate_config

    config = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    validate_config(config, REPO / "schemas" / "config.schema.yaml")
    return config_hash(config)


def design_hash() -> str:
    """The hash of the code that draws every figure (scripts/figure.py's modules)."""
    return code_hash(FIGURE_SCRIPT)


def read_stamp(png: str | Path) -> dict[str, str]:
    """The stamp in a PNG's text chunks (those of its keys it has)."""
    from PIL import Image

    with Image.open(png) as image:
        text = dict(getattr(image, "text", {}))
    return {key: text[key] for key in (COMMIT, CONFIG, DESIGN) if key in text}


def copy_figures(run: str | Path, out: str | Path) -> list[Path]:
    """Copy ``DOCS_FIGURES`` from ``run``/results/figures into ``out`` as they are (their
    stamps with them); ValueError naming the first the run lacks or that has no stamp.
    """
    source = Path(run) / "results" / "figures"
    for name in DOCS_FIGURES:
        png = source / f"{name}.png"
        if not png.is_file():
            raise ValueError(f"{png} does not exist: run the default workflow there first")
        if len(read_stamp(png)) < 3:
            raise ValueError(f"{png} has no provenance stamp: rerun its figure rule")
    Path(out).mkdir(parents=True, exist_ok=True)
    return [
        Path(shutil.copyfile(source / f"{name}.png", Path(out) / f"{name}.png"))
        for name in DOCS_FIGURES
    ]


def stale(folder: str | Path, config: str | Path) -> list[str]:
    """One line per docs figure in ``folder`` that is missing, unstamped, or stamped with
    another config than ``config``'s or another design than the current code's (empty: all
    current).
    """
    now = {CONFIG: file_config_hash(config), DESIGN: design_hash()}
    problems = []
    for name in DOCS_FIGURES:
        png = Path(folder) / f"{name}.png"
        if not png.is_file():
            problems.append(f"{png}: missing")
            continue
        found = read_stamp(png)
        made = found.get(COMMIT, "an unknown commit")
        problems += [
            f"{png}: {key} {found.get(key, 'none')} (made at {made}), now {value}: run the "
            "default workflow and blockcoupling docs --figures RUN"
            for key, value in now.items()
            if found.get(key) != value
        ]
    return problems
