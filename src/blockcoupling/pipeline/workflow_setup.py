"""What the workflow does once when its Snakefile is parsed, before any rule is declared:
``setup_workflow`` checks the config into the Plan, reads the Slurm settings, sizes the shards,
prints the planned output and downloads by rule (a plan over ``budget.max_output_gb`` stops
here; in the main process only, not again in each job's, which re-parses the Snakefile),
sets the jobs' environment (hub offline, pinned math libraries), checks the fetched folders
against the lock file and the Slurm jobs against their partitions. Each refusal is one line
(``SetupError``) that the workflow exits with.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from blockcoupling.lm.hub import LockError, stale
from blockcoupling.pipeline.budget import check_budget
from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.design_units import primary_unit_warnings
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.hub_volume import HUB_BYTES_PER_PARAM, hub_volume, size_text
from blockcoupling.pipeline.job_requests import JobRequests, shard_plan
from blockcoupling.pipeline.plan import Plan
from blockcoupling.pipeline.slurm import ENV, SlurmSettings
from blockcoupling.pipeline.slurm_nodes import Nodes, SlurmError, read_nodes
from blockcoupling.pipeline.slurm_sizing import TooLong
from blockcoupling.runtime import isa


class SetupError(Exception):
    """The one line the workflow exits with (``config error: ...``, ``slurm: ...``)."""


@dataclass(frozen=True)
class WorkflowSetup:
    """What the rules read: the ``plan`` (shards sized), the Slurm ``settings``, whether a Slurm
    profile sends the jobs (``slurm_profile``), each rule's requests (``jobs``) and the cached
    node inventory (``nodes_of``).
    """

    plan: Plan
    settings: SlurmSettings
    slurm_profile: bool
    jobs: JobRequests
    nodes_of: Callable[[str], Nodes | None]


def setup_workflow(
    config: dict[str, Any],
    basedir: str,
    environ: MutableMapping[str, str],
    resources: tuple[Any, Any],
    slurm_profile: bool,
    is_main_process: bool,
    on_slurm: Callable[[], bool],
    max_threads: int | None,
) -> WorkflowSetup:
    """The workflow's setup (``resources``: Snakemake's default and overwritten resources;
    ``slurm_profile``: ``slurm.slurm_profile``; ``on_slurm``: whether jobs go to Slurm, asked
    when they are requested; ``max_threads``: Snakemake's). Sets ``environ`` for the jobs;
    raises ``SetupError``.
    """
    try:
        plan = check_config(config, basedir)
        settings = SlurmSettings.from_env().with_resources(*resources)
    except (ConfigError, SlurmError) as error:
        raise SetupError(f"config error: {error}") from None
    nodes_of = functools.cache(read_nodes)
    if slurm_profile and not settings.status:  # jobs (sbatch passes the environment): a
        environ[f"{ENV}STATUS"] = settings.status_command() or "sacct"  # CANCELLED line advises
    try:  # shards sized to the partition's time limit, the same on the main process and nodes
        plan = shard_plan(plan, settings, nodes_of, slurm_profile, environ)
    except TooLong as error:
        raise SetupError(f"slurm: {error}") from None
    # The quota, once, before the first job: in the main process (a job's own process re-parses
    # the Snakefile, on Slurm each job's: it costs the plan again and could stop a started run)
    try:
        volumes = check_budget(plan) if is_main_process else []
    except ValueError as error:
        raise SetupError(f"config error: {error}") from None
    jobs = JobRequests(plan, settings, on_slurm, nodes_of)
    # The hub cache: every compute job, here or on a node, runs with the hub offline (the
    # variables pass to local jobs and through sbatch's environment); the fetch rules go online.
    environ.update(plan.hub.job_env())
    if plan.unfetched():  # an emptied or damaged revision folder: stop before any job
        raise SetupError(plan.unfetched())
    # Every job's math libraries on one code path (AVX2), so that any x86-64 machine gives the
    # same numbers (blockcoupling.runtime.isa; the runner refuses a job without them).
    try:
        environ.update(isa.job_env())
    except isa.ISAError as error:
        raise SetupError(f"error: {error}") from None
    if slurm_profile:
        check_slurm_jobs(plan, jobs, max_threads)
    check_locked_fetches(plan)
    if plan.hub.ahead and is_main_process:
        download, _, count = hub_volume(plan)
        print(
            f"hub: max_revisions: all: the fetch target fetches every revision ahead ({count} "
            f"model revisions and the datasets, ~{size_text(download)} to keep in "
            f"{plan.hub.cache_dir}, at {HUB_BYTES_PER_PARAM} bytes/parameter; blockcoupling "
            "plan), none is deleted",
            file=sys.stderr,
        )
    if is_main_process:  # after every check: a refused run prints its one line alone
        lines = [*volumes, *(f"warning: {w}" for w in primary_unit_warnings(plan))]
        print("\n".join(f"plan: {line}" for line in lines), file=sys.stderr)
    return WorkflowSetup(plan, settings, slurm_profile, jobs, nodes_of)


def check_locked_fetches(plan: Plan) -> None:
    """The lock file (``hub.lock_file``; lockfile.py) against every fetched folder: a folder
    that holds another commit than the lock pins (a lock file from another machine), or other
    hashes, stops the run before any job, naming what to delete (``lockfile.stale``).
    """
    lock = plan.hub.lock_file
    if not lock:
        return
    for kind, repo, revision, folder, manifest in plan.fetches():
        try:
            reason = stale(folder, manifest, lock, kind, repo, revision)
        except LockError as error:
            raise SetupError(f"config error: hub.lock_file: {error}") from None
        if reason:
            raise SetupError(f"config error: {reason}")


def check_slurm_jobs(plan: Plan, jobs: JobRequests, max_threads: int | None) -> None:
    """Stop before any job if a model's job cannot run on the Slurm partition it goes to (with
    the profile: when the DAG is built, dry runs too; with --executor slurm alone: on start).
    """
    threads = min(plan.threads("extract"), max_threads or sys.maxsize)
    try:
        jobs.check(threads)
    except (SlurmError, TooLong) as error:
        raise SetupError(f"slurm: {error}") from None
