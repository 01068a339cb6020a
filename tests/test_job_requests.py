"""What the rules ask Slurm for, in process (``pipeline.job_requests``, which rules/common.smk
builds once): planned runtimes capped at a partition's limit with their retry, the one-line
refusal where no job fits, the small rules' default, and nothing asked of a local run.
(tests/test_slurm.py runs the same through Snakemake's dry run with fake Slurm commands.)"""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO, SCHEMA

from blockcoupling.pipeline import slurm_sizing
from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.job_requests import DEFAULT_RUNTIME, JobRequests, shard_plan
from blockcoupling.pipeline.plan import Plan
from blockcoupling.pipeline.schema_check import validate_config
from blockcoupling.pipeline.slurm import SlurmSettings
from blockcoupling.pipeline.slurm_nodes import Nodes, parse_sinfo


def smoke_plan(monkeypatch: pytest.MonkeyPatch) -> Plan:
    monkeypatch.chdir(REPO)
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    validate_config(config, SCHEMA)
    return check_config(config, REPO)


def requests(plan: Plan, sinfo: str | None, on_slurm: bool = True) -> JobRequests:
    nodes = parse_sinfo(sinfo) if sinfo else None
    return JobRequests(plan, SlurmSettings.from_env({}), lambda: on_slurm, lambda _: nodes)


def test_every_model_job_and_its_retry_fit_a_20_minute_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sinfo = "batch*|4|24105|(null)|20:00\n"
    jobs = requests(smoke_plan(monkeypatch), sinfo)
    plan = shard_plan(jobs.plan, jobs.settings, jobs.nodes_of, True, {})
    jobs = JobRequests(plan, jobs.settings, jobs.on_slurm, jobs.nodes_of)
    asked = []
    for model in plan.models:
        for first, _ in plan.shards(model):
            rule = "extract_shard" if len(plan.shards(model)) > 1 else "extract"
            for attempt in (1, 2):
                asked.append(jobs.request(rule, model, 1, True, attempt, first).runtime)
    assert asked and max(asked) <= 20
    assert jobs.own()["runtime"](None, 1) == 20  # the 60-minute default, capped


def test_a_one_minute_partition_is_refused_in_one_line_naming_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = smoke_plan(monkeypatch)
    jobs = requests(plan, "batch*|4|24105|(null)|1\n")
    with pytest.raises(
        slurm_sizing.TooLong, match=r"^models\.\S+ \(extract_shard\): planned at"
    ) as error:
        shard_plan(plan, jobs.settings, jobs.nodes_of, True, {})
    assert "\n" not in str(error.value) and "partition batch allows 1 min" in str(error.value)


def test_a_local_run_asks_slurm_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_slurm(partition: str) -> None:
        raise AssertionError(f"asked Slurm about partition {partition!r}")

    plan = smoke_plan(monkeypatch)
    jobs = JobRequests(plan, SlurmSettings.from_env({}), lambda: False, no_slurm)
    jobs.check(threads=1)
    assert jobs.own()["runtime"](None, 1) == DEFAULT_RUNTIME
    assert jobs.resources("extract")["runtime"](_Wildcards(model=next(iter(plan.models))), 1, 1)


def test_a_retried_job_asks_twice_its_own_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule with ``retries`` and its own runtime (extract_run_*, train_*: JOBS.own) asks the
    runtime times the attempt, as the rules say (a cancelled extract_run job was resubmitted with
    the same -t), and never past the partition's limit."""
    plan = smoke_plan(monkeypatch)
    local = JobRequests(plan, SlurmSettings.from_env({}), lambda: False, lambda _: None)
    runtime = local.own(4000, 60)["runtime"]
    assert [runtime(None, attempt) for attempt in (1, 2)] == [60, 120]
    nodes = Nodes("batch", cpus=8, mem_mb=64000, gpus=0, time_limit=90)
    capped = JobRequests(plan, SlurmSettings.from_env({}), lambda: True, lambda _: nodes)
    assert [capped.own(4000, 60)["runtime"](None, attempt) for attempt in (1, 2)] == [60, 90]


def test_shard_sizes_pass_from_the_main_process_to_the_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = smoke_plan(monkeypatch)
    jobs = requests(plan, "batch*|4|24105|(null)|20:00\n")
    environ: dict[str, str] = {}
    decided = shard_plan(plan, jobs.settings, jobs.nodes_of, True, environ)
    on_node = shard_plan(plan, jobs.settings, lambda _: None, False, environ)
    assert on_node.shard_sizes == decided.shard_sizes and environ


class _Wildcards(dict):
    """Snakemake's wildcards: names as attributes and keys."""

    def __getattr__(self, name: str) -> str:
        return self[name]


def test_no_constraint_is_asked_without_a_gpu_constraint(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin passes even an empty constraint (`-C ''`): the key is left out unless set."""
    plan = smoke_plan(monkeypatch)
    plain = JobRequests(plan, SlurmSettings.from_env({}), lambda: True, lambda _: None)
    assert "constraint" not in plain.resources("extract")
    env = {"BLOCKCOUPLING_SLURM_GPU_CONSTRAINT": "a100"}
    constrained = JobRequests(plan, SlurmSettings.from_env(env), lambda: True, lambda _: None)
    assert "constraint" in constrained.resources("extract")
