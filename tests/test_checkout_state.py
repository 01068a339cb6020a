"""The suite passes in a checkout where the workflow has run (the README's order: the default
run, then the tests): no test's Snakemake run works in the checkout's own folder, whose
results/, logs and .snakemake/ would change what a dry run plans (rerun reasons, finished jobs).
"""

from __future__ import annotations

import ast

from conftest import REPO


def snakemake_in_the_checkout(source: str) -> list[str]:
    """The functions of a test module's ``source`` that run Snakemake from the project root
    (``cwd=REPO``) without a working directory of their own (``--directory``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef):
            continue
        body = ast.get_source_segment(source, node) or ""
        runs = '"snakemake"' in body or "SNAKEMAKE" in body
        if runs and "cwd=REPO" in body and '"--directory"' not in body:
            found.append(node.name)
    return found


def test_the_finder_sees_a_dry_run_in_the_checkout() -> None:
    inside = 'def f():\n    subprocess.run([sys.executable, "-m", "snakemake", "-n"], cwd=REPO)\n'
    own = inside.replace('"-n"]', '"-n", "--directory", str(tmp)]')
    assert snakemake_in_the_checkout(inside) == ["f"]
    assert snakemake_in_the_checkout(own) == []


def test_no_test_runs_snakemake_in_the_checkouts_own_folder() -> None:
    offenders = {
        path.name: names
        for path in sorted((REPO / "tests").glob("*.py"))
        if (names := snakemake_in_the_checkout(path.read_text("utf-8")))
    }
    assert offenders == {}, (
        f"these run Snakemake in the checkout (give them --directory of their own): {offenders}"
    )


def test_the_ci_runs_the_test_command_after_a_workflow_run_in_the_same_clone() -> None:
    """.ci/run: the README's test command once, after the smoke workflow in the clone's own
    folder (results/, logs, .snakemake/ there)."""
    lines = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    suite = [i for i, line in enumerate(lines) if line.endswith("-m pytest -q")]
    in_clone = [
        i
        for i, line in enumerate(lines)
        if "snakemake --cores" in line and "config/smoke.yaml" in line and "--directory" not in line
    ]
    assert len(suite) == 1 and in_clone and in_clone[0] < suite[0], (suite, in_clone)
