"""Whether a job fits its Slurm partition (torch-free): a job's needs (``Needs``, from its model
or the ViT sweep), the request it makes of its partition's nodes (``partition_request``:
defaults capped at what the nodes offer, needs no node meets refused), and the check of every
job of a plan (``check_plan``). The workflow's per-rule resources are ``job_requests``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from blockcoupling.pipeline.slurm import ENV, SlurmError, SlurmSettings
from blockcoupling.pipeline.slurm_nodes import Nodes, read_nodes

if TYPE_CHECKING:
    from blockcoupling.pipeline.plan import Plan


@dataclass(frozen=True)
class Needs:
    """What one job needs: memory (MB) and runtime (minutes) declared for its model (None: the
    rule's default), threads, and GPU memory (GB; 0: runs on CPUs).
    """

    threads: int
    mem_mb: int | None = None
    runtime: int | None = None
    gpu_mem_gb: int = 0


@dataclass(frozen=True)
class Request:
    """What a job asks Slurm for ('' partition: the cluster's default)."""

    RESOURCES: ClassVar[tuple[str, ...]] = (
        "slurm_partition",
        "mem_mb",
        "runtime",
        "gpu",
        "gres",
        "constraint",
    )

    partition: str
    mem_mb: int
    runtime: int
    gpus: int
    asked_runtime: int = 0  # the default runtime before it was capped at the limit (0: not)

    def resources(self, settings: SlurmSettings) -> dict[str, Any]:
        """Resources of the Slurm executor plugin (gpu, gres, constraint; 0 and '' ask for
        nothing) with the partition, memory and runtime.
        """
        gres = ""
        if self.gpus and settings.gpu == "gres":
            gres = ":".join(filter(None, ["gpu", settings.gpu_type, str(self.gpus)]))
        return {
            "slurm_partition": self.partition,
            "mem_mb": self.mem_mb,
            "runtime": self.runtime,
            "gpu": self.gpus if settings.gpu == "gpus" else 0,
            "gres": gres,
            "constraint": settings.gpu_constraint if self.gpus else "",
        }


def partition_request(
    name: str,
    needs: Needs,
    defaults: tuple[int, int],
    settings: SlurmSettings,
    nodes_of: Callable[[str], Nodes | None],
) -> Request:
    """The request of job ``name`` (named in errors) from its needs and the rule's default
    ``(mem_mb, runtime)``: defaults are capped at what the nodes of its partition offer (from
    ``nodes_of``; None: unknown, nothing capped; a capped runtime is kept in
    ``asked_runtime``, for the workflow to say), declared needs that no node meets raise
    ``SlurmError``. Threads are capped by Snakemake (``max-threads``) but checked here too.
    """
    gpus = settings.gpu_count(needs.gpu_mem_gb)
    partition = settings.gpu_partition if gpus else settings.partition
    mem_mb, runtime = needs.mem_mb or defaults[0], needs.runtime or defaults[1]
    try:
        nodes = nodes_of(partition)
    except SlurmError as error:
        key = "GPU_PARTITION" if gpus else "PARTITION"
        raise SlurmError(
            f"{name}: {ENV}{key}={partition!r}, but {error}; set it to one of those"
        ) from None
    if nodes is None:
        return Request(partition, mem_mb, runtime, gpus)
    where = f"partition {nodes.partition}"
    if gpus > nodes.gpus:
        raise SlurmError(
            f"{name} needs {gpus} GPU(s) ({needs.gpu_mem_gb} GB) but {where} has at most "
            f"{nodes.gpus} per node: set {ENV}GPU_PARTITION to a GPU partition, "
            f"{ENV}GPU_MEM_GB to your GPUs' memory, or {ENV}GPU=none to run on CPUs"
        )
    if needs.mem_mb and needs.mem_mb > nodes.mem_mb:
        raise SlurmError(
            f"{name} needs mem_mb={needs.mem_mb} but the largest node of {where} has "
            f"{nodes.mem_mb}: choose a partition with larger nodes ({ENV}PARTITION, "
            f"{ENV}GPU_PARTITION) or lower the model's mem_mb"
        )
    if needs.runtime and nodes.time_limit and needs.runtime > nodes.time_limit:
        raise SlurmError(
            f"{name} needs runtime={needs.runtime} min but {where} allows "
            f"{nodes.time_limit}: choose a partition with a longer time limit or lower the "
            "model's runtime"
        )
    if needs.threads > nodes.cpus:
        raise SlurmError(
            f"{name} asks for {needs.threads} threads but the nodes of {where} have at most "
            f"{nodes.cpus} CPUs: run with the slurm profile (it sets max-threads) or lower "
            "extract.threads"
        )
    limit = nodes.time_limit or runtime
    return Request(
        partition,
        min(mem_mb, nodes.mem_mb),
        min(runtime, limit),
        gpus,
        runtime if runtime > limit else 0,
    )


def job_needs(plan: Plan, rule: str, model: str, threads: int) -> tuple[str, Needs]:
    """The name (for errors) and the needs of a job of ``rule`` for ``model`` (``"vit"``: the
    ViT sweep) of a ``workflow.Plan``: GPU memory only where the job runs on a GPU
    (``Plan.on_gpu``, ``options.runs_on_gpu``), at least 1 GB there (one GPU).
    """
    from blockcoupling.jacobians.options import runs_on_gpu

    if model == "vit":
        name, resources = f"vit ({rule})", {}
        on_gpu = runs_on_gpu(plan.vit.device)
    else:
        name, resources = f"models.{model} ({rule})", plan.models[model].resources
        on_gpu = plan.on_gpu(model)
    gpu_mem_gb = max(1, int(resources.get("gpu_mem_gb", 0))) if on_gpu else 0
    return name, Needs(threads, resources.get("mem_mb"), resources.get("runtime"), gpu_mem_gb)


def plan_jobs(plan: Plan) -> list[tuple[str, str]]:
    """(rule, model) of every kind of job that asks Slurm for its own resources."""
    evaluated = plan.evaluated(plan.models)
    jobs = [
        (rule, model)
        for model in plan.models
        for rule in ["extract"] + (["evaluate"] if model in evaluated else [])
    ]
    return jobs + ([("vit_train", "vit"), ("vit_extract", "vit")] if plan.vit else [])


def check_plan(
    plan: Plan,
    settings: SlurmSettings,
    threads: int,
    nodes_of: Callable[[str], Nodes | None] = read_nodes,
) -> None:
    """Raise ``SlurmError`` (one line naming the setting) for the first job of ``plan`` that
    no node of its partition can run (``partition_request``; defaults never raise).
    """
    for rule, model in plan_jobs(plan):
        name, needs = job_needs(plan, rule, model, threads)
        partition_request(name, needs, (1, 1), settings, nodes_of)
