"""What each job of a Plan asks Slurm for, and the checks before the first job: the rules'
Slurm glue (``rules/common.smk`` builds one ``JobRequests`` and hands its functions to the
rules). Memory and runtime come from the planner (``cost``), capped at the partition
(``slurm_fit.partition_request``); a local run asks for nothing that matters.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, replace
from typing import Any

from blockcoupling.pipeline import cost, slurm_sizing
from blockcoupling.pipeline.plan import Plan
from blockcoupling.pipeline.slurm import GROUPED_JOB_MEM_MB, SlurmSettings
from blockcoupling.pipeline.slurm_fit import Request, check_plan, job_needs, partition_request
from blockcoupling.pipeline.slurm_nodes import Nodes, SlurmError

# Rule -> (mem_mb, runtime in minutes) of a model's job when the model declares none and the
# planner cannot tell (no n_layers/d_model in its metadata).
JOB_DEFAULTS = {"extract": (8000, 720), "evaluate": (8000, 240)}
DEFAULT_RUNTIME = 60  # minutes of the other rules (JobRequests.own)
TRAIN_RUNTIME = 60  # minutes of a training job (no planner for it yet)
TRAIN_MEM_MB = 4000
SMALL_JOB_MEM_MB = GROUPED_JOB_MEM_MB  # memory of the other rules
# The shard sizes the main process decided, passed to the jobs on their nodes (sbatch passes the
# environment), so that both see the same jobs.
SHARD_SIZES = "BLOCKCOUPLING_SHARD_SIZES"

NodesOf = Callable[[str], "Nodes | None"]


def job_rates(settings: SlurmSettings) -> cost.Rates:
    """The planner's rates of the model jobs: the GPU's, or the CPU's where Slurm gives no GPU
    (``BLOCKCOUPLING_SLURM_GPU=none``).
    """
    return cost.CPU if settings.gpu == "none" else cost.GPU


def partition_limit(
    plan: Plan, settings: SlurmSettings, nodes_of: NodesOf, model: str
) -> tuple[str, int | None]:
    """(partition, time limit in minutes or None) of the partition a model's jobs go to."""
    _, needs = job_needs(plan, "extract", model, 1)
    partition = (
        settings.gpu_partition if settings.gpu_count(needs.gpu_mem_gb) else settings.partition
    )
    try:
        nodes = nodes_of(partition)
    except SlurmError:  # JobRequests.check names the setting
        return partition or "(default)", None
    if nodes is None:
        return partition or "(default)", None
    return nodes.partition, nodes.time_limit


def shard_plan(
    plan: Plan,
    settings: SlurmSettings,
    nodes_of: NodesOf,
    decides: bool,
    environ: MutableMapping[str, str],
) -> Plan:
    """``plan`` with each model's shards sized to its partition's time limit
    (``slurm_sizing.fit_shards``): decided where ``decides`` (the main process with a Slurm
    profile) and published in ``environ``; read back from it in a job on its node. Raises
    ``slurm_sizing.TooLong``.
    """
    if decides:
        rates = job_rates(settings)
        plan = slurm_sizing.sized_plan(
            plan,
            lambda model: partition_limit(plan, settings, nodes_of, model),
            lambda model: rates if plan.on_gpu(model) else cost.CPU,
        )
        environ[SHARD_SIZES] = json.dumps(plan.shard_sizes)
    elif environ.get(SHARD_SIZES):
        plan = replace(plan, shard_sizes=json.loads(environ[SHARD_SIZES]))
    return plan


@dataclass
class JobRequests:
    """The Slurm requests of a plan's jobs. ``on_slurm``: whether jobs go to Slurm now (asked of
    the workflow's executor; Slurm is asked nothing otherwise); ``nodes_of``: a partition's
    nodes (``slurm_nodes.read_nodes``, cached by the caller).
    """

    plan: Plan
    settings: SlurmSettings
    on_slurm: Callable[[], bool]
    nodes_of: NodesOf

    def __post_init__(self) -> None:
        self.rates = job_rates(self.settings)
        # the planner's longest job per (model or "vit", rule), at the rates of the device jobs get
        self.planned = {
            (row.model, row.rule): row for row in cost.plan_costs(self.plan, gpu=self.rates)
        }
        self.request = functools.cache(self._request)

    def partition_limit(self, model: str) -> tuple[str, int | None]:
        """(partition, time limit in minutes or None) of a model's jobs."""
        return partition_limit(self.plan, self.settings, self.nodes_of, model)

    def defaults(
        self, rule: str, model: str, attempt: int, part: int | None = 0, limit: int | None = None
    ) -> tuple[int, int]:
        """(mem_mb, runtime) of a job whose model declares none: runtime from the planner
        (``slurm_sizing.runtime_minutes``: safety factor and floor, doubled on a retry;
        ``limit``: the partition's, which the floor yields to); ``part``: the first prompt of an
        extract_shard job, None for an extract_tokens job (each its own time).
        """
        mem_mb, runtime = JOB_DEFAULTS.get(rule, (8000, 720))
        seconds = None
        if rule in {"extract_shard", "extract_tokens"}:
            on_gpu = self.plan.on_gpu(model)
            seconds = slurm_sizing.extract_job_seconds(self.plan, model, part, on_gpu, self.rates)
        elif (model, rule) in self.planned:
            seconds = self.planned[(model, rule)].job_seconds
        if seconds is None:
            return mem_mb, runtime * attempt
        return mem_mb, slurm_sizing.runtime_minutes(seconds, attempt, limit)

    def _request(
        self,
        rule: str,
        model: str,
        threads: int,
        with_nodes: bool,
        attempt: int = 1,
        part: int | None = 0,
    ) -> Request:
        """What a model's (or the ViT sweep's, model "vit") job asks Slurm for: memory,
        runtime, partition, GPUs where it runs on a GPU (``Plan.on_gpu``); checked against
        sinfo's nodes when jobs go to Slurm (``with_nodes``).
        """
        name, needs = job_needs(self.plan, rule, model, threads)
        nodes_of = self.nodes_of if with_nodes else lambda partition: None
        limit = self.partition_limit(model)[1] if with_nodes else None
        defaults = self.defaults(rule, model, attempt, part, limit)
        request = partition_request(name, needs, defaults, self.settings, nodes_of)
        if request.asked_runtime:  # a default without a planned time: capped, and said (once)
            print(
                f"slurm: {name} (attempt {attempt}) has no planned runtime (no n_layers/d_model "
                f"in its metadata): asks the partition's {request.runtime} min instead of "
                f"{request.asked_runtime}; declare resources.runtime to choose",
                file=sys.stderr,
            )
        return request

    def resources(self, rule: str, model: str | None = None) -> dict[str, Callable[..., Any]]:
        """The Slurm resources of a model's job of ``rule`` as Snakemake resource functions
        (``model``: a fixed one, e.g. "vit"; else the job's wildcard; 0 and '' ask for nothing;
        a local run ignores them all). No ``constraint`` without ``GPU_CONSTRAINT``: the plugin
        passes even an empty one (``-C ''``).
        """

        def resource(key: str) -> Callable[..., Any]:
            def value(wildcards: Any, threads: int, attempt: int) -> Any:
                name = model or wildcards.model
                part = int(wildcards.shard) if "shard" in wildcards.keys() else 0
                part = None if "prompt" in wildcards.keys() else part
                request = self.request(rule, name, threads, self.on_slurm(), attempt, part)
                return request.resources(self.settings)[key]

            return value

        keys = [key for key in Request.RESOURCES if key != "constraint"]
        keys += ["constraint"] if self.settings.gpu_constraint else []
        return {key: resource(key) for key in keys}

    def own(self, mem_mb: int = SMALL_JOB_MEM_MB, runtime: int = DEFAULT_RUNTIME) -> dict[str, Any]:
        """The memory and runtime a rule without a planned time declares as its own (so that a
        site profile's ``default-resources`` fill only what the workflow leaves open): ``mem_mb``
        and ``runtime`` minutes times the attempt (a retried job, from a rule with ``retries``,
        asks twice the time), at most its CPU partition's limit on Slurm (``check`` says so).
        """

        def capped(wildcards: Any, attempt: int) -> int:
            return self.capped_runtime(runtime * attempt)

        return {"mem_mb": mem_mb, "runtime": capped}

    def capped_runtime(self, runtime: int) -> int:
        """``runtime`` minutes, at most the CPU partition's time limit when jobs go to Slurm."""
        if not self.on_slurm():
            return runtime
        try:
            nodes = self.nodes_of(self.settings.partition)
        except SlurmError:
            return runtime
        limit = nodes.time_limit if nodes is not None else None
        return min(runtime, limit or runtime)

    def check(self, threads: int) -> None:
        """Raise ``SlurmError`` or ``slurm_sizing.TooLong`` if a model's job cannot run on the Slurm
        partition it goes to (nothing when jobs do not go to Slurm); say in one line where the
        small rules' default runtime is capped.
        """
        if not self.on_slurm():
            return
        check_plan(self.plan, self.settings, threads, self.nodes_of)
        self._check_runtimes()

    def _check_runtimes(self) -> None:
        """Raise ``slurm_sizing.TooLong`` for the first job that cannot be split (evaluate,
        vit_train, vit_extract) whose planned runtime, retry included, exceeds its partition's
        limit.
        """
        for (model, rule), row in self.planned.items():
            if rule == "extract":  # sized to fit (slurm_sizing.fit_shards)
                continue
            where, limit = self.partition_limit(model)
            if not slurm_sizing.fits_limit(row.job_seconds, limit):
                name = "vit" if model == "vit" else f"models.{model}"
                fix = slurm_sizing.PARTITION_FIX + (
                    ", or fewer vit epochs" if rule == "vit_train" else ""
                )
                raise slurm_sizing.too_long(f"{name} ({rule})", row.job_seconds, limit, where, fix)
        try:
            nodes = self.nodes_of(self.settings.partition)
        except SlurmError:
            return
        if nodes is not None and nodes.time_limit and nodes.time_limit < DEFAULT_RUNTIME:
            print(
                f"slurm: partition {nodes.partition} allows {nodes.time_limit} min: the jobs "
                f"without a planned runtime (metrics, combine, stats, figures, training) ask "
                f"{nodes.time_limit} min instead of {DEFAULT_RUNTIME}; set-resources "
                "RULE:runtime=N to choose",
                file=sys.stderr,
            )
