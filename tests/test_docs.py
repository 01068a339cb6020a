"""The README and the documentation site say what the code does: every ``blockcoupling.*`` name
and ``src/blockcoupling/*.py`` path they mention exists, and every Python or shell block runs
here or is preceded by ``<!-- not run: REASON -->`` naming why not (needs a cluster, the hub, a
finished run, minutes; on the line before a block's opening fence, blank lines between allowed).
A real model's example belongs in ``docs/tutorial.md``, which its own test executes (slow tier).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import REPO

DOCS = REPO / "docs"
SKIPPED = {"tutorial.md"}  # written with the flat API, tested by its own test
# pages whose code blocks run (the README and the site's own pages)
CODE_PAGES = [REPO / "README.md", *sorted(p for p in DOCS.glob("*.md") if p.name not in SKIPPED)]
# pages whose names must resolve: those, and the two project files the site includes or cites
NAME_PAGES = [*CODE_PAGES, REPO / "CONTRIBUTING.md", REPO / "config" / "README.md"]
RUN_LANGUAGES = {"python", "bash", "sh", "console", "shell"}
NAME = re.compile(r"(?<![\w./-])blockcoupling(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w/])src/blockcoupling/[\w/]+\.py\b")
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*(not run):\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: str | None  # "not run" or None
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with the marker comment before it, if any."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(before)
        found.append(
            Block(
                page,
                i + 1,
                opening.group(1).lower(),
                "\n".join(lines[i + 1 : end]) + "\n",
                marker.group(1) if marker else None,
                marker.group(2) if marker else "",
            )
        )
        i = end + 1
    return found


ALL_BLOCKS = [b for page in CODE_PAGES for b in blocks(page) if b.language in RUN_LANGUAGES]


def environment() -> dict[str, str]:
    """This checkout's package first, and this interpreter's scripts (``blockcoupling``) first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_block(block: Block, tmp_path: Path, timeout: float) -> None:
    if block.language == "python":
        command = [sys.executable, "-c", block.code]
        cwd = tmp_path  # examples write nothing into the repository
    else:
        command = ["bash", "-euo", "pipefail", "-c", block.code]
        cwd = REPO  # commands name the repository's files (config/, results/)
    done = subprocess.run(
        command, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def resolves(name: str) -> bool:
    """``name`` is a module of the package, or an attribute chain of one."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as error:
            if error.name and not ".".join(parts[:i]).startswith(error.name):
                raise  # a dependency of the module is missing: not this test's question
            continue
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def test_every_blockcoupling_name_and_path_in_the_docs_exists() -> None:
    missing = []
    for page in NAME_PAGES:
        text = page.read_text(encoding="utf-8")
        where = page.relative_to(REPO)
        for name in sorted(set(NAME.findall(text))):
            if not resolves(name):
                missing.append(f"{where}: {name}")
        for path in sorted(set(PATH.findall(text))):
            if not (REPO / path).is_file():
                missing.append(f"{where}: {path}")
    assert not missing, "names the code does not have:\n" + "\n".join(missing)


def test_every_block_is_run_or_says_why_not() -> None:
    assert ALL_BLOCKS, "no code blocks found: the fence pattern is wrong"
    unmarked_reasons = [b.id for b in ALL_BLOCKS if b.marker and not b.reason]
    assert not unmarked_reasons, f"a marker without its reason: {unmarked_reasons}"


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.marker is None], ids=lambda b: b.id)
def test_block_runs(block: Block, tmp_path: Path) -> None:
    run_block(block, tmp_path, timeout=300)


def test_the_readme_is_a_users_page() -> None:
    """Short, the test command CI runs, and no commit hash outside the generated claims block."""
    from blockcoupling.stats.claims import END, START

    text = (REPO / "README.md").read_text(encoding="utf-8")
    written = re.sub(r"<!-- (\w+):start -->.*?<!-- \1:end -->", "", text, flags=re.DOTALL)
    assert len(written.splitlines()) <= 180  # the generated claims block grows with the claims
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    command = next(line for line in ci.splitlines() if "the README's test command" in line)
    command = command.split("#")[0].replace("time ", "", 1).strip()
    assert command in text, f"the README lacks CI's test command {command!r}"
    outside = text[: text.index(START)] + text[text.index(END) :]
    hashes = re.findall(r"`([0-9a-f]{7,40})`", outside)
    assert not [h for h in hashes if re.search(r"[a-f]", h) and re.search(r"\d", h)], hashes


def test_the_configuration_page_names_every_config_section() -> None:
    """``config/README.md`` (the workflow catalog's page, included as the site's configuration
    page) covers every top-level key of the schema."""
    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
    text = (REPO / "config" / "README.md").read_text(encoding="utf-8")
    missing = [key for key in schema["properties"] if f"`{key}" not in text]
    assert not missing, f"config/README.md does not describe: {missing}"
    included = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert '--8<-- "config/README.md"' in included


def test_every_page_is_in_the_site_nav() -> None:
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    listed = {page for entry in nav for page in entry.values()}
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages == listed, f"pages not in the nav: {pages - listed}; missing: {listed - pages}"


def test_every_benchmark_record_is_cited() -> None:
    """Each file of ``bench/runs/`` is named by the docs, the README, the code or another record
    (a record's CSV or JSON beside its cited ``.md`` counts, and so do globs such as
    ``name_*.json``): a record cited nowhere is either worth a line on its page or not kept."""
    import fnmatch

    runs = sorted((REPO / "bench" / "runs").iterdir())
    sources = {p: p.read_text(encoding="utf-8") for p in NAME_PAGES}
    sources |= {p: p.read_text(encoding="utf-8") for p in runs if p.suffix == ".md"}
    sources |= {p: p.read_text(encoding="utf-8") for p in (REPO / "src").rglob("*.py")}

    def cited(run: Path) -> bool:
        corpus = "\n".join(text for path, text in sources.items() if path != run)
        globs = re.findall(r"[\w.-]{3,}\*[\w.*-]*\.\w+", corpus)  # name_*.json, not *.md
        return (
            run.name in corpus
            or (run.suffix != ".md" and f"{run.stem}.md" in corpus)
            or any(fnmatch.fnmatch(run.name, pattern) for pattern in globs)
        )

    uncited = [run.name for run in runs if not cited(run)]
    assert not uncited, f"records cited nowhere: {uncited}"


# User pages: the README, the contributing guide, the configuration page and the site's pages
# (records are apart: bench/runs/, CHANGELOG.md, docs/figures/before_after/).
USER_PAGES = [
    REPO / "README.md",
    REPO / "CONTRIBUTING.md",
    REPO / "config" / "README.md",
    *sorted(DOCS.glob("*.md")),
]
COMMIT = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")
ISSUE = re.compile(r"\bissues?[ -]?#?\d+|(?<![\w&])#\d{1,5}\b", re.IGNORECASE)
GENERATED = re.compile(r"<!-- (\w+):start -->.*?<!-- \1:end -->", re.DOTALL)
RECORD_PATH = re.compile(r"bench/runs/[\w./*-]+")  # a record's name may carry its commit


def lab_notes(text: str) -> list[str]:
    """Commit hashes and issue numbers in ``text`` outside generated blocks and record paths."""
    text = RECORD_PATH.sub("", GENERATED.sub("", text))
    return [m.group() for pattern in (COMMIT, ISSUE) for m in pattern.finditer(text)]


def test_the_lab_notes_pattern_finds_hashes_and_issue_numbers() -> None:
    found = lab_notes(
        "at `733d5d5`, after issue 41 (issue-25, #12); `bench/runs/pilot_9c23181.md`; "
        "<!-- claims:start -->commit `73e4872eb3`<!-- claims:end --> 0.0125, 2026-11-27"
    )
    assert found == ["733d5d5", "issue 41", "issue-25", "#12"]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_user_pages_carry_no_commit_hashes_or_issue_numbers(page: Path) -> None:
    """History (timings per commit, what an issue found) goes to ``bench/runs/`` or the changelog;
    a user page says what holds now. Generated blocks (the README's claims) are exempt."""
    assert not lab_notes(page.read_text(encoding="utf-8")), page.name


def test_one_measured_test_time_stated_once() -> None:
    """The suite's time is measured in one place (the performance page) and linked elsewhere."""
    link = "performance.md#the-test-suite-and-ci"
    minutes = re.compile(r"(?:about|~)\s*\d+\s*min", re.IGNORECASE)
    for page in (REPO / "README.md", REPO / "CONTRIBUTING.md", DOCS / "development.md"):
        text = page.read_text(encoding="utf-8")
        assert link in text, f"{page.name} does not link the measured test time"
        tests = [line for line in text.splitlines() if "pytest" in line or "suite" in line]
        assert not [line for line in tests if minutes.search(line)], page.name
    assert "the full suite 8 min" in (DOCS / "performance.md").read_text(encoding="utf-8")


def test_the_pages_costs_of_more_runs_come_from_the_default_run_record() -> None:
    """The job-minutes a fixed-size run and a checkpoint suite cost, and what the layered configs'
    42 runs and 46 suites add, follow from the newest default-run record's table (10 of each),
    wherever a page states them."""
    record = sorted((REPO / "bench" / "runs").glob("default_run_*.md"))[-1].read_text()
    minutes = {
        part: float(value)
        for part, value in re.findall(r"^\| ([^|]+?) \| \d+ \| ([\d.]+) \|$", record, re.M)
    }
    run = (
        minutes["fixed-size runs: training"] + minutes["fixed-size runs: measure and metrics"]
    ) / 10
    suite = (
        minutes["checkpoint suites: training"] + minutes["checkpoint suites: measure and metrics"]
    ) / 10
    expected = {
        "a run": f"{run:.2f}".rstrip("0"),
        "per run": f"{run:.2f}".rstrip("0"),
        "a suite": f"{suite:.1f}",
        "runs": f"{round(42 * run)}",
        "suites": f"{round(46 * suite)}",
    }
    pages = [REPO / "README.md", *DOCS.glob("*.md"), REPO / "config" / "README.md"]
    said = 0
    for page in pages:
        text = re.sub(r"\s+", " ", page.read_text(encoding="utf-8"))
        for value in re.findall(r"about ([\d.]+) job-minutes (?:a run|per run)", text):
            assert value == expected["a run"], (page.name, value, expected)
            said += 1
        for value in re.findall(r"about ([\d.]+) job-minutes a suite", text):
            assert value == expected["a suite"], (page.name, value, expected)
            said += 1
        for value in re.findall(r"42 (?:more )?runs[^.]*?about (\d+) (?:more )?job-minutes", text):
            assert value == expected["runs"], (page.name, value, expected)
            said += 1
    assert said >= 5, said
