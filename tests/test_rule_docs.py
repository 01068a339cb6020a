"""Every rule has a one-line docstring, so `snakemake --list-rules` reads like a table of
contents: a rule written once per figure or per dimension says which one it is."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import REPO

from blockcoupling.pipeline.figure_registry import DOCS, FIGURES, doc


def test_every_rule_opens_with_a_one_line_docstring() -> None:
    files = [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]
    rules, bare = 0, []
    for path in files:
        lines = path.read_text("utf-8").splitlines()
        for number, line in enumerate(lines):
            if not re.match(r"^\s*rule(\s+\w+)?:\s*$", line):
                continue
            rules += 1
            following = lines[number + 1].strip() if number + 1 < len(lines) else ""
            if not re.fullmatch(r'f?"""[^"]{10,100}"""', following):
                bare.append(f"{path.name}:{number + 1}: {line.strip()}")
    assert rules >= 25, rules  # every rule definition was seen
    assert not bare, "rules without a one-line docstring: " + "; ".join(bare)


def test_each_figure_rule_names_the_figure_it_draws() -> None:
    """--list-rules of the smoke DAG: every rule's line is its own (15 figure rules once read
    "Draw one figure of the report", both combine rules one line), and a figure rule's names
    the paper figure its caption's first sentence names."""
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--list-rules",
        "--configfile",
        "config/smoke.yaml",
    ]
    with tempfile.TemporaryDirectory() as work:  # not the checkout's own state
        command += ["--directory", work]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = dict(re.findall(r"^(\w+) \((.*)\)$", done.stdout, re.M))
    figures = {name: text for name, text in listed.items() if name.startswith("figure_")}
    assert figures and len(set(listed.values())) == len(listed), listed
    assert set(DOCS) == set(FIGURES)
    for name, text in figures.items():
        figure = name.removeprefix("figure_")
        assert text == doc(figure)
        caption = (REPO / "report" / f"{figure}.rst").read_text("utf-8").split(". ")[0]
        paper = DOCS[figure][1].split(",")[0]
        assert paper.split(":")[-1].split("/")[0] in caption, (name, paper, caption)


def test_per_run_rules_say_which_stage_they_are_an_instance_of(tmp_path: Path) -> None:
    """The default's --list-rules listed 60 per-run train_/extract_run_/metrics_ lines that buried
    the stages: each names its stage (``Stage extract_run_{run} for run R: ...``), so the listing
    filters to a table of stages (docs/workflow.md)."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")),
            *("--configfile", str(REPO / "config.yaml"), "--list-rules"),
        ],
        cwd=tmp_path,  # its own working directory: never the checkout's .snakemake/
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    listed = dict(re.findall(r"^(\w+) \((.*)\)$", done.stdout, re.M))
    stages_per_run = ("train_", "extract_run_", "metrics_")
    per_run = {n: t for n, t in listed.items() if n.startswith(stages_per_run)}
    assert len(per_run) >= 3, listed
    for name, text in per_run.items():
        stage = next(s for s in stages_per_run if name.startswith(s))
        assert text.startswith(f"Stage {stage}{{run}} for run "), (name, text)
    stages = [n for n, t in listed.items() if not t.startswith("Stage ")]
    assert len(stages) <= 45, stages  # the table of contents: stages, not runs
