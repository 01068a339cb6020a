"""Running the study as the README says: `snakemake --profile slurm` from the project root, a
--configfile that replaces config.yaml, and conda envs pinned like the .venv."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO, fake_slurm


def dry_run(*args: str, env: dict[str, str] | None = None, sinfo: str | None = None) -> str:
    """A dry run from the project root, as a user types it, in a working directory of its own
    (the checkout's results/, logs and .snakemake/, where a run left them, would add their
    rerun reasons to the plan); its output. Slurm's commands fail (a Slurm client without a
    controller), or with ``sinfo`` answer as conftest.fake_slurm's cluster of those partitions,
    so that a cluster on this machine changes nothing.
    """
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "snakemake", "-n", "--nolock", *args]
        command += ["--directory", str(Path(folder) / "work")]
        if sinfo is not None:
            fake_slurm(Path(folder), sinfo)
        else:
            for name in ("sinfo", "scontrol", "squeue", "sacct"):
                (Path(folder) / name).write_text("#!/bin/sh\nexit 1\n")
                (Path(folder) / name).chmod(0o755)
        environ = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}", **(env or {})}
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environ)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def planned_models(text: str) -> set[str]:
    """The models whose extraction files a dry run plans (per-model rules and the per-run rules
    of models trained here alike)."""
    return set(re.findall(r"results/extract/([^/,\s]+)/", text))


def job_resources(text: str, rule: str) -> dict[str, dict[str, str]]:
    """Model -> resources of the first job of ``rule`` for it in a dry run's output."""
    found: dict[str, dict[str, str]] = {}
    for block in text.split("\nrule ")[1:]:
        model = re.search(r"wildcards: model=([^,\s]+)", block)
        if block.startswith(f"{rule}:") and model and model.group(1) not in found:
            line = re.search(r"resources: (.*)", block).group(1)
            found[model.group(1)] = dict(item.split("=", 1) for item in line.split(", "))
    return found


def test_profile_slurm_runs_exactly_the_configfiles_dag() -> None:
    """`--profile slurm` from the root (./slurm), and a --configfile that replaces config.yaml
    instead of being merged into it (Snakemake's merge planned the default's models too)."""
    text = dry_run("--profile", "slurm", "--configfile", "config/smoke.yaml")
    assert "Using profile slurm" in text
    assert (REPO / "slurm").resolve() == (REPO / "profiles" / "slurm").resolve()
    finals = {f"fixed_size-f{f}-s{s}-final" for f in ("0.5", "1.0") for s in (0, 1)}
    assert planned_models(text) == finals | {"emergence-s0", "tiny-gguf"}


# A cluster whose partitions allow 24 hours: batch (CPUs) and gpu (4 H100s per node)
DAY = "batch*|16|256000|(null)|1-00:00:00\ngpu|32|1024000|gpu:h100:4|1-00:00:00\n"


@pytest.fixture(scope="module")
def paper_dry_run() -> str:
    """The paper suite's dry run through the shipped profile on the DAY cluster, GPUs asked as
    gres on partition gpu (one run serves this file's two paper tests: ~13 s)."""
    env = {"BLOCKCOUPLING_SLURM_GPU": "gres", "BLOCKCOUPLING_SLURM_GPU_PARTITION": "gpu"}
    return dry_run("--profile", "slurm", "--configfile", "config/paper.yaml", env=env, sinfo=DAY)


@pytest.mark.slow
def test_the_paper_suite_plans_its_models_only_and_asks_gpus_per_model(paper_dry_run: str) -> None:
    with open(REPO / "resources" / "paper_models.tsv", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    gpu_mem = {row["name"]: int(row["gpu_mem_gb"]) for row in rows}
    text = paper_dry_run
    assert planned_models(text) == set(gpu_mem) | {"pythia-6.9b-steps", "pythia-12b-steps"}
    # one job per model and step (extract), or shards where a job would not fit (extract_shard)
    extract = {**job_resources(text, "extract"), **job_resources(text, "extract_shard")}
    tokens = job_resources(text, "extract_tokens")
    assert {m: r["gres"] for m, r in tokens.items()} == {
        m: r["gres"] for m, r in extract.items() if m in tokens
    }
    for model, gb in gpu_mem.items():
        gpus = -(-gb // 80)
        assert extract[model]["gres"] == f"gpu:{gpus}", model
        assert extract[model]["slurm_partition"] == "gpu"
        assert int(extract[model]["mem_mb"]) == max(16000, 1500 * gb)
    assert extract["pythia-12b-steps"]["gres"] == "gpu:1"  # 80 GB (config/paper.yaml)
    for rule in ("metrics", "combine_models", "stats"):
        block = re.split(rf"\n *rule {rule}:", text)[1]  # metrics: inside a group job
        assert "gres=gpu" not in re.split(r"\n *resources: ", block)[1].split("\n")[0]
    for rule in ("vit_train", "vit_extract"):  # vit.device cuda: one GPU each
        block = re.split(rf"\n *rule {rule}:", text)[1]
        resources = re.split(r"\n *resources: ", block)[1].split("\n")[0]
        assert "gres=gpu:1" in resources and "slurm_partition=gpu" in resources


@pytest.mark.slow
def test_plan_and_the_dry_run_agree_on_shards_and_runtimes_under_a_24_hour_limit(
    paper_dry_run: str, tmp_path: Path
) -> None:
    import pandas as pd

    from blockcoupling import cli

    jobs: dict[str, int] = {}
    longest: dict[str, int] = {}
    for body in re.findall(
        r"rule extract(?:_shard|_tokens)?:\n(.*?)(?=\n\[|\nrule |\Z)", paper_dry_run, re.S
    ):
        model = re.search(r"wildcards: model=([^,\s]+)", body).group(1)
        runtime = int(re.search(r"runtime=(\d+)", body).group(1))
        jobs[model] = jobs.get(model, 0) + 1
        longest[model] = max(longest.get(model, 0), runtime)
    table = tmp_path / "plan.csv"
    paper = str(REPO / "config" / "paper.yaml")
    assert (
        cli.main(["plan", "--configfile", paper, "--time-limit", "1-00:00:00", "--csv", str(table)])
        == 0
    )
    rows = pd.read_csv(table).query("rule == 'extract'")
    assert len(rows) == len(jobs) == 44
    for row in rows.itertuples():
        assert (row.jobs, row.runtime_min) == (jobs[row.model], longest[row.model]), row.model
        assert 2 * row.runtime_min <= 24 * 60


def pins(lines: list[str]) -> dict[str, str]:
    """Normalized package name -> pinned version of ``name==version`` lines."""
    found = {}
    for line in lines:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)==(\S+)\s*", line.split("#")[0])
        if match:
            found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return found


@pytest.mark.parametrize("env", ["torch", "analysis"])
def test_conda_envs_pin_the_same_versions_as_the_venv(env: str) -> None:
    venv = pins((REPO / "requirements.txt").read_text().splitlines())
    venv |= pins((REPO / "requirements-models.txt").read_text().splitlines())
    venv |= pins(re.findall(r"\S+==\S+", (REPO / "install.sh").read_text()))  # torch
    spec = yaml.safe_load((REPO / "envs" / f"{env}.yaml").read_text())
    pip = next(item["pip"] for item in spec["dependencies"] if isinstance(item, dict))
    assert all("==" in line for line in pip), f"envs/{env}.yaml has an unpinned pip line"
    pinned = pins(pip)
    assert pinned, env
    assert {name: venv.get(name) for name in pinned} == pinned
    python = re.search(r"PYTHON:-python(\d+\.\d+)", (REPO / "install.sh").read_text()).group(1)
    assert f"python={python}" in spec["dependencies"]
