"""The quota guard: the planned output and downloads by rule, and a plan over
``budget.max_output_gb`` refused in one line before any job (``blockcoupling plan`` and the
workflow's setup).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO, smoke

from blockcoupling import cli
from blockcoupling.pipeline.budget import check_budget, output_by_rule
from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.cost import GB, plan_costs
from blockcoupling.pipeline.workflow_setup import SetupError, setup_workflow


def written(tmp_path: Path, config: dict) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_plan_prints_the_volumes_by_rule(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["plan", "--configfile", str(REPO / "config" / "paper.yaml")]) == 0
    out = capsys.readouterr().out
    assert "(budget.max_output_gb = 500); by rule: vit_extract" in out
    assert "download: " in out and "by rule: fetch_checkpoint" in out


def test_plan_over_the_budget_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = smoke(budget={"max_output_gb": 1e-6})
    plan = check_config(dict(config), REPO)
    output = output_by_rule(plan_costs(plan))
    dominant = next(iter(output))
    assert cli.main(["plan", "--configfile", written(tmp_path, config)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("stop:")]
    assert len(lines) == 1
    assert f"budget.max_output_gb = 1e-06; rule {dominant} writes" in lines[0]
    with pytest.raises(ValueError, match=rf"more than budget.max_output_gb .* rule {dominant}"):
        check_budget(plan)


def test_the_workflow_stops_before_any_job(capsys: pytest.CaptureFixture) -> None:
    def setup(config: dict) -> None:
        setup_workflow(
            config, str(REPO), {}, ({}, {}), False, True, lambda: False, max_threads=None
        )

    total = sum(output_by_rule(plan_costs(check_config(smoke(), REPO))).values())
    assert total > 0
    setup(smoke())
    assert "plan: output: " in capsys.readouterr().err
    with pytest.raises(SetupError, match=r"^config error: budget\.max_output_gb: the plan writes"):
        setup(smoke(budget={"max_output_gb": total / GB / 2}))
    setup(smoke(budget={"max_output_gb": None}))  # no limit


def test_the_quota_is_checked_once_in_the_main_process_not_in_each_job(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Every job's process re-parses the Snakefile (on Slurm each one's): the quota check ran
    there again, costing the plan per job and able to stop a job of a started run. It runs in
    the main process (Snakemake's ``workflow.is_main_process``, which rules/common.smk passes)
    and in no job's."""
    from blockcoupling.pipeline import workflow_setup

    calls = []
    monkeypatch.setattr(
        workflow_setup, "check_budget", lambda plan: calls.append(plan) or check_budget(plan)
    )
    over = smoke(budget={"max_output_gb": 1e-6})

    def setup(main: bool) -> None:
        setup_workflow(over, str(REPO), {}, ({}, {}), False, main, lambda: False, None)

    setup(main=False)  # a job's process: no check, no refusal, no volume lines
    assert calls == [] and "plan: output" not in capsys.readouterr().err
    with pytest.raises(SetupError, match=r"^config error: budget\.max_output_gb"):
        setup(main=True)
    assert len(calls) == 1
    common = (REPO / "rules" / "common.smk").read_text()
    assert "workflow.is_main_process," in common.split("setup_workflow(", 1)[1].split(")\n", 1)[0]


def test_stored_ks_are_planned_and_checked() -> None:
    def output(**extract) -> float:
        plan = check_config(smoke(extract=extract), REPO)
        return sum(output_by_rule(plan_costs(plan)).values())

    reduced, every, more = output(), output(stored_ks="all"), output(stored_ks=[2, 4, 8])
    assert reduced < more < every  # metrics.ks [4, 8] < three Ks < every K up to k_max 8
    plan = check_config(smoke(extract={"stored_ks": "all"}), REPO)
    assert plan.extraction.stored_ks is None and plan.extract["stored_ks"] is None
    assert check_config(smoke(), REPO).extract["stored_ks"] == [4, 8]  # the jobs' param
    with pytest.raises(ValueError, match=r"metrics.ks has K=4, which extract.stored_ks=\[8\]"):
        check_config(smoke(extract={"stored_ks": [8]}), REPO)
