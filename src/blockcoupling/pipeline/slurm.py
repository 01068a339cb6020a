"""The Slurm settings and profile detection (torch-free; read by profiles/slurm and
rules/common.smk): what the user's environment asks, and the groups of short jobs. What a
partition's nodes offer is ``slurm_nodes``; whether a job fits them, ``slurm_fit``.

The user's settings are environment variables, all optional (README, "On a cluster"):

- ``BLOCKCOUPLING_SLURM_ACCOUNT``: account of every job (default: the plugin guesses it from
  your recent jobs, or submits without one).
- ``BLOCKCOUPLING_SLURM_PARTITION``: partition of every job (default: the cluster's default).
- ``BLOCKCOUPLING_SLURM_GPU_PARTITION``: partition of the jobs that get GPUs (default: the above).
- ``BLOCKCOUPLING_SLURM_GPU``: how GPUs are asked for: ``gpus`` (``--gpus=N``, the default),
  ``gres`` (``--gres=gpu:N``) or ``gres:TYPE`` (``--gres=gpu:TYPE:N``), or ``none`` (a CPU
  cluster: no GPU is requested and models run on CPUs).
- ``BLOCKCOUPLING_SLURM_GPU_MEM_GB``: memory of one GPU in GB (default 80); a model's
  ``gpu_mem_gb`` over this, rounded up, is its GPU count.
- ``BLOCKCOUPLING_SLURM_GPU_CONSTRAINT``: node feature the GPU jobs require (``-C``).
- ``BLOCKCOUPLING_SLURM_STATUS``: ``sacct`` or ``squeue``, how the plugin polls jobs (default:
  ``squeue`` where Slurm keeps no accounting database, since ``sacct`` cannot answer there).
- ``BLOCKCOUPLING_SLURM_BATCH``: how many short CPU jobs one Slurm job runs (default 1: each
  its own job), or ``node``: as many as a node's CPUs (see below).

What a partition's nodes offer comes from ``sinfo``: threads are capped at a node's CPUs (the
profile's ``max-threads``), a rule's default memory and runtime at a node's memory and the
partition's time limit, and a model's own needs (memory, runtime, GPUs) that no node meets stop
the run before any job, with one line naming the model and the fix.

With ``BLOCKCOUPLING_SLURM_BATCH``, the short single-thread CPU jobs (metrics, combine, stats,
figures) go to Slurm in batches: each such rule names its group (``job_group``), and the
profile's ``group-components`` puts up to ``group_width`` jobs of one group into one Slurm job
that runs them side by side. No job of a group reads another's output, so a batch is one layer:
it asks one job's runtime, ``width`` CPUs and ``width`` times one job's memory
(``GROUPED_JOB_MEM_MB``), and pays Slurm's and Snakemake's start-up once instead of ``width``
times, but starts only when all its jobs' inputs exist (``bench/slurm_batches.sh`` measures it).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from blockcoupling.pipeline.slurm_nodes import Nodes, SlurmError, read_nodes, run_slurm_command

ENV = "BLOCKCOUPLING_SLURM_"
GPU_KINDS = ("gpus", "gres", "none")
STATUS_COMMANDS = ("sacct", "squeue")
# Group -> its rules (fnmatch patterns). Within a group no job depends on another (test_slurm).
JOB_GROUPS: dict[str, tuple[str, ...]] = {
    "metrics": ("metrics",),
    "combine": ("combine_models", "combine_checkpoints", "vit_combine"),
    "stats": ("stats", "stats_summary", "stats_checkpoints", "stats_emergence", "vit_stats"),
    "figures": ("figure_*",),  # stats_claims: its own job (figures read claims.csv)
}
GROUPED_JOB_MEM_MB = 2000  # the profile's default mem_mb, which the grouped rules take


def job_group(rule: str) -> str | None:
    """The group of ``rule``'s jobs on Slurm (a rule's ``group:``); None: each its own job."""
    for group, patterns in JOB_GROUPS.items():
        if any(fnmatch(rule, pattern) for pattern in patterns):
            return group
    return None


def slurm_jobs(rule_counts: Mapping[str, int], width: int) -> int:
    """How many Slurm jobs run ``rule_counts`` (jobs per rule, local rules left out) when up to
    ``width`` jobs of a group share one (Snakemake's group-components: ceil(n / width) each).
    """
    grouped: dict[str, int] = {}
    single = 0
    for rule, count in rule_counts.items():
        group = job_group(rule)
        if group is None:
            single += count
        else:
            grouped[group] = grouped.get(group, 0) + count
    return single + sum(math.ceil(count / width) for count in grouped.values())


# The rules whose jobs may get GPUs (their partition: BLOCKCOUPLING_SLURM_GPU_PARTITION, or the
# first of them given a slurm_partition by --set-resources).
GPU_RULES = ("extract_shard", "extract", "extract_tokens", "evaluate", "vit_train", "vit_extract")


def resource_text(resources: Any, key: str) -> str:
    """The text of resource ``key`` in Snakemake's resource settings (a mapping, or its
    ``Resources`` of parsed ``KEY=VALUE`` expressions; quotes removed); '' where unset.
    """
    if resources is None:
        return ""
    value = resources.get(key)
    if value is None:
        return ""
    if hasattr(value, "is_evaluable"):  # snakemake.resources.Resource (an expression: its text)
        value = value.raw if value.is_evaluable() else value.value
    if value is None:
        return ""
    text = str(value).strip()
    return text[1:-1] if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"" else text


def slurm_requested(argv: list[str], environ: Mapping[str, str]) -> bool:
    """Whether this Snakemake invocation (its ``argv``) sends jobs to Slurm: ``--executor
    slurm`` (``-e slurm``), or a profile (``--profile``, ``SNAKEMAKE_PROFILE``), found where
    Snakemake finds it, whose config says ``executor: slurm``. Read when the workflow is
    parsed, before Snakemake tells it its executor, so that the checks and the shard sizes
    apply with any Slurm profile: the shipped one or a site's own.
    """
    if _option(argv, ("--executor", "-e")) == "slurm":
        return True
    return any(str(c.get("executor", "")) == "slurm" for c in profile_configs(argv, environ))


def _option(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the first of option ``names`` on the command line (None: not given)."""
    for index, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if name in names:
            return value if equals else (argv[index + 1] if index + 1 < len(argv) else "")
    return None


def profile_configs(argv: list[str], environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """The raw config.yaml of each profile this invocation names (``--profile``, else
    ``SNAKEMAKE_PROFILE``), found where Snakemake finds it, a relative one also in the folder
    the command started in (``PWD``: the workflow is parsed in ``--directory``); none without
    Snakemake.
    """
    import yaml

    profiles: list[str] = []
    for index, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name == "--profile":
            profiles += [value] if value else argv[index + 1 : index + 2]
    if not profiles and environ.get("SNAKEMAKE_PROFILE"):
        profiles = [environ["SNAKEMAKE_PROFILE"]]
    try:
        from snakemake.cli import get_profile_dir
    except ImportError:  # no Snakemake here: no profile to read
        return []
    configs = []
    for profile in profiles:
        found = get_profile_dir(profile)
        started = Path(environ.get("PWD", ".")) / profile / "config.yaml"  # before --directory
        path = found[1] if found is not None else started if started.is_file() else None
        if path is None:
            continue
        try:
            config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            continue
        configs += [config] if isinstance(config, dict) else []
    return configs


def status_command_given(argv: list[str], environ: Mapping[str, str]) -> bool:
    """Whether this invocation sets the Slurm plugin's status command: on the command line
    (``--slurm-status-command``) or in a profile (``slurm-status-command``, any value: the
    shipped profile's is ``SlurmSettings.status_command``).
    """
    if _option(argv, ("--slurm-status-command",)):
        return True
    return any(c.get("slurm-status-command") for c in profile_configs(argv, environ))


def sacct_problem(sacct: str | None = None) -> str:
    """Why ``sacct`` cannot tell a job's state here ('' when it can, or when there is no
    ``sacct``: the plugin then polls with squeue): it fails, hangs, or says that Slurm keeps
    no accounting ("accounting storage is disabled", which it prints with exit status 0).
    """
    sacct = sacct or shutil.which("sacct")
    if sacct is None:
        return ""
    command = [sacct, "-X", "-n", "-o", "JobID", "-S", "now"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "sacct got no answer in 30 s"
    except OSError as error:
        return f"sacct failed ({error})"
    said = " ".join(f"{done.stdout} {done.stderr}".split())
    if "accounting storage is disabled" in said.lower():
        return f"sacct says {said[:120]!r}"
    if done.returncode != 0:
        return f"sacct failed with exit status {done.returncode} ({said[:120]!r})"
    return ""


def unpolled_jobs(
    argv: list[str], environ: Mapping[str, str], problem: Callable[[], str] = sacct_problem
) -> str:
    """The one line a Slurm run stops with before its first job when the plugin would poll
    its jobs with a ``sacct`` that cannot answer (a failed job never noticed, the run waiting
    forever): no status command is set (``status_command_given``) and ``problem`` says why
    sacct cannot tell; '' otherwise.
    """
    if environ.get("BLOCKCOUPLING_SLURM_PROFILE") == "1":  # the shipped profile sets its own
        return ""
    if status_command_given(argv, environ) or environ.get(f"{ENV}STATUS"):
        return ""
    why = problem()
    if not why:
        return ""
    return (
        f"slurm: {why}: the Slurm plugin would poll jobs with sacct and never see one end; add "
        "`slurm-status-command: squeue` to your profile's config.yaml (or pass "
        "--slurm-status-command squeue)"
    )


def slurm_profile(is_main_process: bool, argv: list[str], environ: Mapping[str, str]) -> bool:
    """Whether this Snakemake process sends jobs to Slurm: the shipped profile says so
    (``BLOCKCOUPLING_SLURM_PROFILE=1``, profiles/slurm/config.yaml), or a site's own profile or
    ``--executor slurm`` does (``slurm_requested``), so that a dry run checks and shows what a
    real run would ask; a job on its node (not the main process) does not.
    """
    return is_main_process and (
        environ.get("BLOCKCOUPLING_SLURM_PROFILE") == "1" or slurm_requested(argv, environ)
    )


@dataclass(frozen=True)
class SlurmSettings:
    """The ``BLOCKCOUPLING_SLURM_*`` settings ('' : unset)."""

    account: str = ""
    partition: str = ""
    gpu_partition: str = ""
    gpu: str = "gpus"
    gpu_type: str = ""
    gpu_mem_gb: int = 80
    gpu_constraint: str = ""
    status: str = ""
    batch: int | None = 1  # short CPU jobs per Slurm job; None: a node's CPUs

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SlurmSettings:
        """The settings from the environment (``os.environ`` by default)."""
        env = os.environ if environ is None else environ

        def get(key: str) -> str:
            return env.get(ENV + key, "").strip()

        gpu, _, gpu_type = (get("GPU") or "gpus").partition(":")
        if gpu not in GPU_KINDS or (gpu_type and gpu != "gres"):
            raise SlurmError(f"{ENV}GPU={get('GPU')!r}: use gpus, gres, gres:TYPE or none")
        gpu_mem = get("GPU_MEM_GB") or "80"
        if not gpu_mem.isdigit() or int(gpu_mem) < 1:
            raise SlurmError(f"{ENV}GPU_MEM_GB={gpu_mem!r}: give the GB of one GPU, e.g. 80")
        if get("STATUS") not in ("", *STATUS_COMMANDS):
            raise SlurmError(f"{ENV}STATUS={get('STATUS')!r}: use sacct or squeue")
        batch = get("BATCH") or "1"
        if batch != "node" and not (batch.isdigit() and int(batch) >= 1):
            raise SlurmError(f"{ENV}BATCH={batch!r}: give a number of jobs, e.g. 8, or node")
        return cls(
            account=get("ACCOUNT"),
            partition=get("PARTITION"),
            gpu_partition=get("GPU_PARTITION") or get("PARTITION"),
            gpu=gpu,
            gpu_type=gpu_type,
            gpu_mem_gb=int(gpu_mem),
            gpu_constraint=get("GPU_CONSTRAINT"),
            status=get("STATUS"),
            batch=None if batch == "node" else int(batch),
        )

    def with_resources(self, defaults: Any, overrides: Mapping[str, Any]) -> SlurmSettings:
        """The settings with the partition and account given as the Slurm plugin's own
        resources where the variables leave them unset: ``slurm_partition`` and
        ``slurm_account`` of ``--default-resources`` (``defaults``), and the GPU partition from
        ``--set-resources RULE:slurm_partition=...`` of a GPU rule (``overrides``, ``GPU_RULES``
        in order).
        """
        partition = self.partition or resource_text(defaults, "slurm_partition")
        gpu_partition = self.gpu_partition if self.gpu_partition != self.partition else ""
        for rule in GPU_RULES:
            gpu_partition = gpu_partition or resource_text(
                (overrides or {}).get(rule), "slurm_partition"
            )
        return replace(
            self,
            partition=partition,
            gpu_partition=gpu_partition or partition,
            account=self.account or resource_text(defaults, "slurm_account"),
        )

    def gpu_count(self, gpu_mem_gb: int) -> int:
        """GPUs for a job needing ``gpu_mem_gb`` GB of GPU memory (0: none, or GPUs off)."""
        if self.gpu == "none" or gpu_mem_gb <= 0:
            return 0
        return math.ceil(gpu_mem_gb / self.gpu_mem_gb)

    def status_command(
        self, scontrol_config: str | None = None, problem: Callable[[], str] = sacct_problem
    ) -> str | None:
        """The plugin's status command: the setting; else ``squeue`` where Slurm keeps no
        accounting (``scontrol show config`` says ``accounting_storage/none``) or ``sacct``
        cannot answer (``problem``: ``sacct_problem``); else None (the plugin's default,
        ``sacct``).
        """
        if self.status:
            return self.status
        config = (
            run_slurm_command(["scontrol", "show", "config"])
            if scontrol_config is None
            else scontrol_config
        )
        if config and re.search(
            r"^AccountingStorageType\s*=\s*accounting_storage/none", config, re.M
        ):
            return "squeue"
        return "squeue" if problem() else None

    def max_threads(self, nodes_of: Callable[[str], Nodes | None] | None = None) -> int | None:
        """The most CPUs of one node in both partitions (the profile's ``max-threads``); None
        where sinfo cannot tell (no Slurm here).
        """
        nodes_of = nodes_of or read_nodes
        found = []
        for partition in {self.partition, self.gpu_partition}:
            try:
                found.append(nodes_of(partition))
            except SlurmError:  # the workflow's check names the setting
                continue
        cpus = [nodes.cpus for nodes in found if nodes is not None]
        return min(cpus) if cpus else None

    def group_width(self, nodes_of: Callable[[str], Nodes | None] | None = None) -> int:
        """How many jobs of a group one Slurm job runs side by side: the ``batch`` setting, at
        most a node's CPUs of the (CPU) partition and its memory over ``GROUPED_JOB_MEM_MB``;
        1 (no batches) where sinfo cannot tell.
        """
        if self.batch == 1:
            return 1
        try:
            nodes = (nodes_of or read_nodes)(self.partition)
        except SlurmError:  # the workflow's check names the setting
            return 1
        if nodes is None:
            return 1
        fits = min(nodes.cpus, nodes.mem_mb // GROUPED_JOB_MEM_MB)
        return max(1, min(fits, self.batch or fits))

    def group_components(self, nodes_of: Callable[[str], Nodes | None] | None = None) -> list[str]:
        """The profile's ``group-components``: ``GROUP=WIDTH`` for every group of
        ``JOB_GROUPS`` (empty where the width is 1: nothing to batch).
        """
        width = self.group_width(nodes_of)
        return [f"{group}={width}" for group in JOB_GROUPS] if width > 1 else []
