"""What jobs ask Slurm for: settings from the environment, sinfo's nodes, and requests that are
capped at the nodes (defaults) or stopped with one line (needs no node meets)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, fake_slurm

from blockcoupling.pipeline import slurm, slurm_nodes
from blockcoupling.pipeline.slurm import ENV, JOB_GROUPS, SlurmSettings
from blockcoupling.pipeline.slurm_fit import Needs, partition_request
from blockcoupling.pipeline.slurm_nodes import Nodes, SlurmError, gpus_in, minutes, parse_sinfo

# sinfo -h -N -o "%P|%c|%m|%G|%l" of a cluster with a default CPU partition and a GPU partition
# (the first line is what the CI's single-node cluster printed).
SINFO = """\
cpu*|2|24105|(null)|infinite
cpu*|64|256000|(null)|infinite
gpu|32|512000|gpu:a100:4(S:0-1)|2-00:00:00
gpu|16|128000|gpu:a100:2,gpu:v100:2|2-00:00:00
"""
NODES = {"": parse_sinfo(SINFO), "cpu": parse_sinfo(SINFO, "cpu"), "gpu": parse_sinfo(SINFO, "gpu")}


def settings(**env: str) -> SlurmSettings:
    return SlurmSettings.from_env({ENV + key: value for key, value in env.items()})


def request(needs: Needs, defaults=(8000, 720), **env: str):
    return partition_request("models.m (extract)", needs, defaults, settings(**env), NODES.get)


def test_settings_default_to_the_clusters_defaults() -> None:
    unset = settings()
    assert (unset.account, unset.partition, unset.gpu_partition) == ("", "", "")
    assert (unset.gpu, unset.gpu_mem_gb, unset.status) == ("gpus", 80, "")
    assert settings(PARTITION="cpu").gpu_partition == "cpu"
    assert settings(PARTITION="cpu", GPU_PARTITION="gpu").gpu_partition == "gpu"
    assert (settings(GPU="gres:a100").gpu, settings(GPU="gres:a100").gpu_type) == ("gres", "a100")


@pytest.mark.parametrize(
    "key, value",
    [
        ("GPU", "cuda"),
        ("GPU", "gpus:a100"),
        ("GPU_MEM_GB", "0"),
        ("GPU_MEM_GB", "x"),
        ("STATUS", "q"),
        ("BATCH", "0"),
        ("BATCH", "all"),
    ],
)
def test_a_bad_setting_names_the_variable(key: str, value: str) -> None:
    with pytest.raises(SlurmError, match=f"^{ENV}{key}="):
        settings(**{key: value})


def test_gpu_count_is_gpu_memory_over_one_gpus_memory_rounded_up() -> None:
    assert [settings().gpu_count(gb) for gb in (0, 16, 80, 81, 240)] == [0, 1, 1, 2, 3]
    assert settings(GPU_MEM_GB="40").gpu_count(48) == 2
    assert settings(GPU="none").gpu_count(240) == 0


def test_sinfo_gives_the_largest_node_and_the_time_limit() -> None:
    assert NODES[""] == Nodes("cpu", cpus=64, mem_mb=256000, gpus=0, time_limit=None)
    assert NODES["gpu"] == Nodes("gpu", cpus=32, mem_mb=512000, gpus=4, time_limit=2 * 1440)
    assert parse_sinfo(SINFO, "debug") is None
    assert parse_sinfo("") is None


@pytest.mark.parametrize(
    "gres, count",
    [("(null)", 0), ("gpu:4", 4), ("gpu:a100:4(S:0-1)", 4), ("gpu:a:2,gpu:b:2", 4), ("mps:100", 0)],
)
def test_gpus_in_a_nodes_gres(gres: str, count: int) -> None:
    assert gpus_in(gres) == count


@pytest.mark.parametrize(
    "limit, value",
    [("infinite", None), ("30", 30), ("30:00", 30), ("1:30:00", 90), ("2-00:00:00", 2880)],
)
def test_time_limits_in_minutes(limit: str, value: int | None) -> None:
    assert minutes(limit) == value


def test_a_cpu_job_goes_to_the_partition_with_its_declared_memory() -> None:
    job = request(Needs(threads=4, mem_mb=64000, runtime=30))
    assert (job.partition, job.mem_mb, job.runtime, job.gpus) == ("", 64000, 30, 0)
    resources = job.resources(settings())
    assert (resources["gpu"], resources["gres"], resources["constraint"]) == (0, "", "")


def test_a_gpu_job_goes_to_the_gpu_partition_in_the_form_asked_for() -> None:
    env = {"PARTITION": "cpu", "GPU_PARTITION": "gpu", "GPU_CONSTRAINT": "a100"}
    job = request(Needs(threads=4, gpu_mem_gb=160), **env)
    assert (job.partition, job.gpus) == ("gpu", 2)
    assert job.resources(settings(**env)) == {
        "slurm_partition": "gpu",
        "mem_mb": 8000,
        "runtime": 720,
        "gpu": 2,
        "gres": "",
        "constraint": "a100",
    }
    gres = {**env, "GPU": "gres:a100"}
    assert request(Needs(threads=4, gpu_mem_gb=80), **gres).resources(settings(**gres))["gres"] == (
        "gpu:a100:1"
    )
    plain = {**env, "GPU": "gres"}
    job = request(Needs(threads=4, gpu_mem_gb=80), **plain)
    assert job.resources(settings(**plain))["gres"] == "gpu:1"


def test_gpus_off_runs_every_model_on_the_cpu_partition() -> None:
    job = request(
        Needs(threads=4, gpu_mem_gb=240), PARTITION="cpu", GPU_PARTITION="gpu", GPU="none"
    )
    assert (job.partition, job.gpus) == ("cpu", 0)


def test_defaults_are_capped_at_the_nodes() -> None:
    job = request(Needs(threads=2), defaults=(10**6, 10**5), GPU_PARTITION="gpu")
    assert (job.mem_mb, job.runtime) == (256000, 10**5)  # cpu: unlimited time
    gpu_job = request(Needs(threads=2, gpu_mem_gb=16), defaults=(10**6, 10**5), GPU_PARTITION="gpu")
    assert (gpu_job.mem_mb, gpu_job.runtime) == (512000, 2880)


@pytest.mark.parametrize(
    "needs, env, message",
    [
        (Needs(threads=2, gpu_mem_gb=16), {}, r"needs 1 GPU\(s\) .* partition cpu has at most 0"),
        (Needs(threads=2, gpu_mem_gb=400), {"GPU_PARTITION": "gpu"}, "needs 5 GPU"),
        (Needs(threads=2, mem_mb=300000), {}, "needs mem_mb=300000 .* has 256000"),
        (
            Needs(threads=2, runtime=3000, gpu_mem_gb=8),
            {"GPU_PARTITION": "gpu"},
            "needs runtime=3000 min .* allows 2880",
        ),
        (Needs(threads=128), {}, "asks for 128 threads .* at most 64 CPUs"),
    ],
)
def test_needs_no_node_meets_stop_with_one_line(needs: Needs, env: dict, message: str) -> None:
    with pytest.raises(SlurmError, match=f"^models.m \\(extract\\) {message}") as error:
        request(needs, **env)
    assert "\n" not in str(error.value)


def test_without_sinfo_nothing_is_capped_or_checked() -> None:
    job = partition_request(
        "m", Needs(threads=999, mem_mb=10**7, gpu_mem_gb=240), (1, 1), settings(), lambda p: None
    )
    assert (job.mem_mb, job.runtime, job.gpus) == (10**7, 1, 3)


def test_max_threads_is_the_smallest_partitions_largest_node() -> None:
    assert settings(PARTITION="cpu", GPU_PARTITION="gpu").max_threads(NODES.get) == 32
    assert settings().max_threads(NODES.get) == 64
    assert settings().max_threads(lambda partition: None) is None


def test_status_command_is_squeue_where_slurm_keeps_no_accounting() -> None:
    no_accounting = "AccountingStorageType   = accounting_storage/none\nMinJobAge = 300 sec\n"
    with_dbd = "AccountingStorageType   = accounting_storage/slurmdbd\n"
    answers = lambda: ""  # noqa: E731 - a sacct that answers
    assert settings().status_command(no_accounting, answers) == "squeue"
    assert settings().status_command(with_dbd, answers) is None
    assert settings().status_command("", answers) is None
    assert settings(STATUS="sacct").status_command(no_accounting, answers) == "sacct"
    assert settings().status_command(with_dbd, lambda: "sacct failed") == "squeue"


# --- what the workflow asks Slurm, and when (fake Slurm commands on PATH that log their calls) ---
def dry_run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    folder = fake_slurm(tmp_path / "bin" if (tmp_path / "bin").mkdir() is None else tmp_path)
    environ = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}", **env}
    environ.pop("BLOCKCOUPLING_SLURM_PROFILE", None)
    command = [sys.executable, "-m", "snakemake", "-n", "--nolock", "--quiet", *args]
    work = tmp_path / "work"
    return subprocess.run(
        [*command, "--directory", str(work)], cwd=REPO, capture_output=True, text=True, env=environ
    )


def test_a_local_dry_run_asks_slurm_nothing(tmp_path: Path) -> None:
    done = dry_run(tmp_path, "--configfile", "config/smoke.yaml")
    assert done.returncode == 0, done.stderr[-2000:]
    calls = (
        (tmp_path / "bin" / "calls").read_text() if (tmp_path / "bin" / "calls").exists() else ""
    )
    # the Slurm plugin's own import probes `scontrol show config` (upstream); the workflow nothing
    assert "sinfo" not in calls


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {ENV + "GPU_PARTITION": "nope"},
            f"{ENV}GPU_PARTITION='nope', but sinfo lists no partition",
        ),
        ({}, "needs 1 GPU(s) (80 GB) but partition batch has at most 0 per node"),
    ],
)
def test_a_dry_run_with_the_profile_stops_in_one_line_where_a_real_run_would(
    tmp_path: Path, env: dict, message: str
) -> None:
    done = dry_run(tmp_path, "--profile", "slurm", "--configfile", "config/paper.yaml", **env)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("slurm: ")]
    assert len(lines) == 1 and message in lines[0], done.stderr[-2000:]
    assert "sinfo" in (tmp_path / "bin" / "calls").read_text()


def test_a_controller_that_does_not_answer_is_said_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    fake_slurm(tmp_path, scontrol_sleep=5)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm_nodes, "TIMEOUT_S", 0.5)
    assert settings().status_command() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the Slurm controller does not answer" in err[0]


def test_runtime_is_the_planned_time_with_a_safety_factor_and_floor_doubled_on_a_retry() -> None:
    from blockcoupling.pipeline import slurm_sizing

    assert slurm_sizing.runtime_minutes(0) == slurm_sizing.RUNTIME_FLOOR_MIN
    assert slurm_sizing.runtime_minutes(3600) == 3 * 60  # 3x an hour
    assert slurm_sizing.runtime_minutes(3600, attempt=2) == 2 * 3 * 60


def test_no_rule_asks_more_time_than_its_partition_allows(tmp_path: Path) -> None:
    short = "batch*|4|24105|(null)|20:00\n"  # a 20-minute partition
    fake_slurm(tmp_path / "bin" if (tmp_path / "bin").mkdir() is None else tmp_path, short)
    environ = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    command = [sys.executable, "-m", "snakemake", "-n", "--nolock", "--profile", "slurm"]
    command += ["--configfile", "config/smoke.yaml", "--directory", str(tmp_path / "work")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environ)
    assert done.returncode == 0, done.stderr[-2000:]
    runtimes = [int(value) for value in re.findall(r"\bruntime=(\d+)", done.stdout)]
    assert runtimes and max(runtimes) <= 20
    assert re.search(r"rule vit_train:(.|\n)*?resources: .*runtime=", done.stdout)
    # the small rules' 60 minutes are capped, and that is said in one line
    assert "slurm: partition batch allows 20 min: the jobs without a planned runtime" in (
        done.stderr
    )
    # a planned job's retry (twice its first request) fits too: the floor yields to the limit
    planned = re.findall(
        r"rule (?:extract(?:_shard|_tokens)?|evaluate):(?:.|\n)*?runtime=(\d+)", done.stdout
    )
    assert planned and all(2 * int(value) <= 20 for value in planned)


def test_a_partition_no_job_fits_stops_the_dry_run_in_one_line(tmp_path: Path) -> None:
    minute = "batch*|4|24105|(null)|1\n"  # MaxTime=1: the smallest extraction cannot fit
    fake_slurm(tmp_path / "bin" if (tmp_path / "bin").mkdir() is None else tmp_path, minute)
    environ = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    command = [sys.executable, "-m", "snakemake", "-n", "--nolock", "--profile", "slurm"]
    command += ["--configfile", "config/smoke.yaml", "--directory", str(tmp_path / "work")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environ)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("slurm: ")]
    assert len(lines) == 1, done.stderr[-2000:]
    assert re.search(
        r"slurm: models\.\S+ \(extract_shard\): planned at [\d.]+ min per job, it asks \d+ min "
        r"\(3x, doubled on its retry\) but partition batch allows 1 min: choose a partition",
        lines[0],
    ), lines[0]
    assert "Traceback" not in done.stderr


def paper_plan():
    from blockcoupling.cli.config_commands import load_plan

    return load_plan(REPO / "config" / "paper.yaml", check_memory=False)


@pytest.mark.parametrize("limit", [24 * 60, 18 * 60])
def test_shards_follow_from_the_time_limit_and_each_attempt_fits(limit: int) -> None:
    from blockcoupling.pipeline import cost, slurm_sizing

    plan = paper_plan()
    sized = slurm_sizing.sized_plan(plan, lambda model: ("gpu", limit), lambda model: cost.GPU)
    for model in plan.models:
        entry = plan.models[model]
        shape = cost.shape_of(entry.meta, entry.load)
        first, count = sized.shards(model)[0]
        assert sum(n for _, n in sized.shards(model)) == plan.n_prompts
        seconds = [
            slurm_sizing.extract_job_seconds(sized, model, part, True)
            for part in [first for first, _ in sized.shards(model)] + sized.token_jobs(model)[:1]
        ]
        for value in seconds:  # the retry of every job fits, none capped
            assert slurm_sizing.runtime_minutes(value, 2, limit) <= limit, (model, limit)
        if model in sized.shard_sizes:  # resized: one more prompt per shard would not fit
            options = plan.extraction_for(model)  # one job over every prompt: its token
            if count + 1 < plan.n_prompts:  # families too; a shard: theirs are jobs of their own
                options = cost.replace(options, token_prompts=0)
            bigger = cost.extract_cost(shape, options.for_shard(0), count + 1, cost.GPU)
            over = sum(bigger["seconds"].values()) + cost.GPU.overhead
            assert slurm_sizing.runtime_minutes(over, 2, limit) > limit
    # the longest job of the paper suite asks 1,779 min (llama-3-70b) in its configured shards
    assert max(r.job_seconds for r in cost.plan_costs(plan)) * 3 / 60 > 24 * 60
    assert (
        "llama-3-70b"
        in slurm_sizing.sized_plan(
            plan, lambda model: ("gpu", 24 * 60), lambda model: cost.GPU
        ).shard_sizes
    )


def test_a_job_that_no_shard_size_fits_is_refused_in_one_line() -> None:
    from blockcoupling.pipeline import cost, slurm_sizing

    plan = paper_plan()
    # 3 hours: llama-3-70b's shards fit, but one token prompt's own job (~32 min x 3 x 2) not
    with pytest.raises(slurm_sizing.TooLong) as error:
        slurm_sizing.sized_plan(plan, lambda model: ("gpu", 3 * 60), lambda model: cost.GPU)
    message = str(error.value)
    assert "\n" not in message
    assert re.match(
        r"models\.\S+ \(extract_tokens\): planned at [\d.]+ min per job, it asks \d+ min "
        r"\(3x, doubled on its retry\) but partition gpu allows 180 min: choose a partition "
        r"with a longer time limit .*, or lower extract.token_max_tokens or token_layers$",
        message,
    ), message
    with pytest.raises(slurm_sizing.TooLong, match=r"\(extract_shard\).* allows 1 min"):
        slurm_sizing.sized_plan(plan, lambda model: ("short", 1), lambda model: cost.CPU)


def test_check_config_with_the_profile_runs_the_same_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from blockcoupling import cli

    fake_slurm(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    paper = str(REPO / "config" / "paper.yaml")
    monkeypatch.setenv(ENV + "GPU_PARTITION", "nope")
    assert cli.main(["check-config", paper, "--profile", "slurm"]) == 2
    assert f"{ENV}GPU_PARTITION='nope', but sinfo lists no partition" in capsys.readouterr().err
    monkeypatch.setenv(ENV + "GPU_PARTITION", "gpu")
    assert cli.main(["check-config", paper, "--profile", "slurm"]) == 0
    assert "Slurm: every job fits a node of its partition" in capsys.readouterr().out
    monkeypatch.setenv(ENV + "GPU", "none")  # on CPUs: the models' host memory on batch's nodes
    assert cli.main(["check-config", paper, "--profile", "slurm"]) == 2
    assert "but the largest node of partition batch has 24105" in capsys.readouterr().err


# --- the short CPU jobs in batches (the rules' group:, the profile's group-components) ---


def test_batches_are_off_by_default_and_at_most_a_nodes_cpus_and_memory() -> None:
    assert settings(PARTITION="cpu").group_width(NODES.get) == 1  # BATCH unset: no batches
    assert settings(PARTITION="cpu").group_components(NODES.get) == []
    assert settings(PARTITION="cpu", BATCH="node").group_width(NODES.get) == 64  # 256 GB: 128
    assert settings(PARTITION="cpu", BATCH="8").group_width(NODES.get) == 8
    assert settings(PARTITION="gpu", BATCH="node").group_width(NODES.get) == 32
    assert settings(BATCH="100").group_width(lambda partition: NODES["cpu"]) == 64
    small = parse_sinfo("batch*|16|7000|(null)|infinite\n")
    assert settings(BATCH="node").group_width(lambda partition: small) == 3  # 7000 // 2000 MB
    assert settings(BATCH="node").group_width(lambda partition: None) == 1
    components = settings(PARTITION="cpu", BATCH="4").group_components(NODES.get)
    assert components == [f"{group}=4" for group in JOB_GROUPS]


def test_slurm_jobs_counts_a_batch_of_up_to_width_jobs_of_a_group_as_one() -> None:
    counts = {"extract": 8, "metrics": 8, "figure_a": 12, "stats_claims": 1, "stats": 1}
    assert slurm.slurm_jobs(counts, 1) == sum(counts.values())
    # 8 extract + ceil(8/3) metrics + ceil(12/3) figures + stats_claims alone (figures read
    # its claims.csv) + 1 stats
    assert slurm.slurm_jobs(counts, 3) == 8 + 3 + 4 + 1 + 1
    assert slurm.job_group("figure_depth_heatmaps") == "figures"
    assert slurm.job_group("extract") is None


RULE_GROUPS = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings
with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
    workflow = api.workflow(
        resource_settings=ResourceSettings(),
        config_settings=ConfigSettings(configfiles=[Path(sys.argv[1])]),
        snakefile=Path(sys.argv[2]),
        workdir=Path(sys.argv[3]),
    )
    print(json.dumps({rule.name: rule._group for rule in workflow._workflow.rules}))
    workflow.dag(DAGSettings(print_dag_as="dot")).printrulegraph()  # as --rulegraph prints it
"""


def test_each_rule_is_in_its_group_and_no_job_of_a_group_reads_anothers(tmp_path: Path) -> None:
    smoke, snakefile = str(REPO / "config" / "smoke.yaml"), str(REPO / "Snakefile")
    script = [sys.executable, "-c", RULE_GROUPS, smoke, snakefile, str(tmp_path)]
    done = subprocess.run(script, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    first, graph = done.stdout.split("\n", 1)
    groups = json.loads(first)
    assert groups == {rule: slurm.job_group(rule) for rule in groups}
    assert set(JOB_GROUPS) == set(groups.values()) - {None}  # the smoke DAG has every group
    names = dict(re.findall(r'(\d+)\[label = "(\w+)"', graph))
    edges = re.findall(r"(\d+) -> (\d+)", graph)
    assert {rule for rule, group in groups.items() if group} <= set(names.values()) and edges
    for source, target in edges:
        group = slurm.job_group(names[source])
        assert group is None or group != slurm.job_group(names[target]), (source, target)


# --- a site's own profile: the workflow brings every job's requests and checks ---------------

# a site's own profile as the README shows it: the QoS as the plugin's option (slurm_extra may
# not carry --qos), short site defaults of runtime and memory that the workflow's own requests
# must win over
SITE_PROFILE = """\
executor: slurm
jobs: 10
slurm-qos: high
default-resources:
  slurm_account: "'acct'"
  slurm_partition: batch
  runtime: 45
  mem_mb: 3000
set-resources:
  extract_shard:
    slurm_partition: gpu
"""


def test_slurm_requested_reads_the_executor_and_the_profiles_snakemake_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "home" / ".config" / "snakemake" / "site"
    site.mkdir(parents=True)
    (site / "config.yaml").write_text(SITE_PROFILE)
    local = tmp_path / "home" / ".config" / "snakemake" / "local"
    local.mkdir()
    (local / "config.yaml").write_text("cores: 2\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert slurm.slurm_requested(["snakemake", "--executor", "slurm"], {})
    assert slurm.slurm_requested(["snakemake", "-e", "slurm"], {})
    assert slurm.slurm_requested(["snakemake", "--executor=slurm"], {})
    assert slurm.slurm_requested(["snakemake", "--profile", "site", "-n"], {})
    assert slurm.slurm_requested(["snakemake"], {"SNAKEMAKE_PROFILE": "site"})
    assert not slurm.slurm_requested(["snakemake", "--profile", "local"], {})
    assert not slurm.slurm_requested(["snakemake", "--cores", "2"], {})
    assert not slurm.slurm_requested(["snakemake", "--profile", "nowhere"], {})


NO_ACCOUNTING = "Slurm accounting storage is disabled"


def test_a_sacct_without_accounting_stops_a_profile_without_a_status_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sacct prints "accounting storage is disabled" with exit status 0 where Slurm keeps no
    accounting; a profile that leaves the plugin on sacct then never sees a job end. The run
    stops with one line naming the fix; a status command on the command line, in the profile
    or in the shipped profile's variable lets it go on; a working sacct says nothing."""
    fake_slurm(tmp_path)
    (tmp_path / "sacct").write_text(f"#!/bin/sh\necho '{NO_ACCOUNTING}'\n")
    home = tmp_path / "home" / ".config" / "snakemake"
    (home / "site").mkdir(parents=True)
    (home / "site" / "config.yaml").write_text(SITE_PROFILE)
    (home / "polled").mkdir()
    (home / "polled" / "config.yaml").write_text(SITE_PROFILE + "slurm-status-command: squeue\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert slurm.sacct_problem() == f"sacct says {NO_ACCOUNTING!r}"
    line = slurm.unpolled_jobs(["snakemake", "--profile", "site"], {})
    assert line.startswith("slurm: sacct says") and "\n" not in line
    assert "`slurm-status-command: squeue`" in line
    assert slurm.unpolled_jobs(["snakemake", "--profile", "polled"], {}) == ""
    given = ["snakemake", "--profile", "site", "--slurm-status-command", "squeue"]
    assert slurm.unpolled_jobs(given, {}) == ""
    assert slurm.unpolled_jobs(["snakemake", "--profile", "site"], {ENV + "STATUS": "squeue"}) == ""
    shipped = {"BLOCKCOUPLING_SLURM_PROFILE": "1"}  # its config sets status_command() itself
    assert slurm.unpolled_jobs(["snakemake", "--profile", "slurm"], shipped) == ""
    # a profile named relative to where the command started, the workflow parsed in --directory
    (tmp_path / "project" / "relative").mkdir(parents=True)
    (tmp_path / "project" / "relative" / "config.yaml").write_text(
        SITE_PROFILE + "slurm-status-command: squeue\n"
    )
    monkeypatch.chdir(tmp_path / "home")  # --directory: not where the command started
    started = {"PWD": str(tmp_path / "project")}
    assert slurm.unpolled_jobs(["snakemake", "--profile", "relative"], started) == ""
    assert slurm.unpolled_jobs(["snakemake", "--profile", "relative"], {}).startswith("slurm:")
    assert settings().status_command("") == "squeue"  # the shipped profile sets it itself
    (tmp_path / "sacct").write_text("#!/bin/sh\nexit 1\n")
    assert slurm.sacct_problem().startswith("sacct failed with exit status 1")
    (tmp_path / "sacct").write_text("#!/bin/sh\necho 12345\n")
    assert slurm.sacct_problem() == "" and settings().status_command("") is None


def test_a_site_profile_on_a_cluster_without_accounting_stops_before_any_job(
    tmp_path: Path,
) -> None:
    """The workflow with a site profile as docs/cluster.md once showed it (no status command)
    where sacct says accounting is disabled: a dry run exits 1 with the one line."""
    folder = fake_slurm(tmp_path / "bin" if (tmp_path / "bin").mkdir() is None else tmp_path)
    (folder / "sacct").write_text(f"#!/bin/sh\necho '{NO_ACCOUNTING}'\n")
    site = tmp_path / "home" / ".config" / "snakemake" / "site"
    site.mkdir(parents=True)
    (site / "config.yaml").write_text(SITE_PROFILE)
    environ = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}
    environ |= {"HOME": str(tmp_path / "home")}
    for key in ("XDG_CONFIG_HOME", "BLOCKCOUPLING_SLURM_PROFILE", ENV + "STATUS"):
        environ.pop(key, None)
    command = [sys.executable, "-m", "snakemake", "-n", "--nolock", "--profile", "site"]
    command += ["--configfile", "config/smoke.yaml", "--directory", str(tmp_path / "work")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environ)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("slurm: ")]
    assert len(lines) == 1 and "slurm-status-command: squeue" in lines[0], done.stderr[-2000:]


def test_partition_and_account_as_the_plugins_own_resources() -> None:
    from snakemake.resources import Resources

    defaults = Resources.parse(
        ["slurm_account='acct'", "slurm_partition=batch"], allow_expressions=True, defaults="full"
    )
    overrides = {"extract_shard": Resources.parse(["slurm_partition=gpu"], allow_expressions=True)}
    assert slurm.resource_text(defaults, "slurm_account") == "acct"
    assert slurm.resource_text(defaults, "mem_mb") == ""  # Snakemake's own default: no text
    found = settings().with_resources(defaults, overrides)
    assert (found.account, found.partition, found.gpu_partition) == ("acct", "batch", "gpu")
    # the variables stay shortcuts, and win
    env = settings(PARTITION="cpu", ACCOUNT="a2").with_resources(defaults, overrides)
    assert (env.account, env.partition, env.gpu_partition) == ("a2", "cpu", "gpu")
    gpu = settings(GPU_PARTITION="big").with_resources(defaults, overrides)
    assert gpu.gpu_partition == "big"
    assert settings().with_resources(None, {}) == settings()


def resources_by_rule(stdout: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for rule, body in re.findall(
        r"rule (\w+):\n(.*?)(?=\n\[|\nrule |\nlocalrule |\Z)", stdout, re.S
    ):
        line = re.search(r"resources: (.*)", body)
        if line:
            kept = [p for p in line.group(1).split(", ") if not p.startswith(("tmpdir", "disk"))]
            found.setdefault(rule, set()).add(", ".join(kept))
    return found


def test_a_site_profile_gets_the_same_requests_as_the_shipped_one(tmp_path: Path) -> None:
    """A site's own profile (executor, account, partition as the plugin's resources, a QoS,
    default runtime 45 and mem_mb 3000) in $HOME/.config/snakemake gets every job's memory and
    runtime from the workflow (training its 60 minutes, the small rules 60 min / 2000 MB), and
    the checks: the same requests as --profile slurm with the variables; no empty constraint."""
    cluster = "batch*|4|24105|(null)|2:00:00\ngpu|16|512000|gpu:4|1-00:00:00\n"
    folder = fake_slurm(
        tmp_path / "bin" if (tmp_path / "bin").mkdir() is None else tmp_path, cluster
    )
    site = tmp_path / "home" / ".config" / "snakemake" / "site"
    site.mkdir(parents=True)
    (site / "config.yaml").write_text(SITE_PROFILE)
    environ = {
        **os.environ,
        "PATH": f"{folder}:{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),
    }
    environ.pop("XDG_CONFIG_HOME", None)
    environ.pop("BLOCKCOUPLING_SLURM_PROFILE", None)
    runs = {}
    for profile, env in [
        ("site", {}),
        (
            "slurm",
            {ENV + "ACCOUNT": "acct", ENV + "PARTITION": "batch", ENV + "GPU_PARTITION": "gpu"},
        ),
    ]:
        command = [sys.executable, "-m", "snakemake", "-n", "--nolock", "--profile", profile]
        command += ["--configfile", "config/smoke.yaml", "--directory", str(tmp_path / "work")]
        done = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, env={**environ, **env}
        )
        assert done.returncode == 0, done.stderr[-2000:]
        found = resources_by_rule(done.stdout)
        local = ("all", "vit_data")  # not sent to Slurm: the site's defaults may fill them
        runs[profile] = {rule: found[rule] for rule in found if rule not in local}
    assert runs["site"] == runs["slurm"]
    small = "mem_mb=2000, mem=2 GB, mem_mib=1908"
    assert all(small in text and "runtime=60" in text for text in runs["site"]["metrics"])
    trains = [found for rule, found in runs["site"].items() if rule.startswith("train_")]
    assert trains and all("mem_mb=4000" in t and "runtime=60" in t for f in trains for t in f)
    texts = [text for found in runs["site"].values() for text in found]
    assert not any("runtime=45" in text or "mem_mb=3000" in text for text in texts), texts
    assert not any("constraint=" in text for text in texts)


def test_the_shipped_profile_checks_job_states_soon_after_a_job_ends() -> None:
    """The plugin's first status check comes 40 s after a job ends by default, so every run
    waited about 40 s after its last job: the shipped profile asks after 10."""
    import yaml

    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["slurm-init-seconds-before-status-checks"] == 10


def test_the_job_counts_docs_cluster_states_are_the_smoke_dags(tmp_path: Path) -> None:
    """docs/cluster.md's smoke DAG job count and its Slurm share (all but the local rules) are
    what a dry run counts (the page said 66 jobs where the DAG had 59)."""
    text = " ".join((REPO / "docs" / "cluster.md").read_text().split())
    stated = re.search(
        r"smoke DAG \((\d+) jobs; `all` and `vit_data` .*?so (\d+) Slurm jobs\)", text
    )
    assert stated, "docs/cluster.md no longer states the smoke DAG's job count"
    command = [sys.executable, "-m", "snakemake", "-n", "--nolock", "--quiet", "rules"]
    command += ["--configfile", "config/smoke.yaml", "--directory", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", done.stdout, re.M))
    local = int(counts.get("all", 0)) + int(counts.get("vit_data", 0))
    assert (int(stated[1]), int(stated[2])) == (int(counts["total"]), int(counts["total"]) - local)
