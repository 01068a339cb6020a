"""Slurm sizing from the cost model: the runtime each job asks (a safety factor, a floor, doubled
on its retry), whether it fits a partition's time limit, and extraction shards sized so that
every job does (``fit_shards``, ``sized_plan``); ``TooLong`` where none can.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from blockcoupling.pipeline.cost import CPU, GPU, Rates, extract_cost, shape_of

if TYPE_CHECKING:
    from blockcoupling.pipeline.plan import Plan

# A job's Slurm runtime: the planner's longest job times RUNTIME_SAFETY (the GPU rates come from
# one H200: another GPU or a shared node may be slower), at least RUNTIME_FLOOR_MIN (model load,
# start).
RUNTIME_SAFETY = 3.0
RUNTIME_FLOOR_MIN = 30


RETRIES = 1  # retries of the rules with a planned runtime (extract*, evaluate, vit_*)


class TooLong(ValueError):
    """A job whose planned runtime, with its safety factor and retry, exceeds its partition's
    time limit however it is split; the message names the rule, estimate, limit and fix.
    """


def runtime_minutes(job_seconds: float, attempt: int = 1, limit: int | None = None) -> int:
    """The runtime a job asks for: ``RUNTIME_SAFETY`` x the planned seconds, at least
    ``RUNTIME_FLOOR_MIN`` (at most the share of a ``limit`` that leaves room for the retries:
    the floor is a margin, not an estimate), doubled on each retry (``attempt`` 2: twice).
    """
    floor = RUNTIME_FLOOR_MIN
    if limit:
        floor = max(1, min(floor, limit // 2**RETRIES))
    return max(floor, math.ceil(RUNTIME_SAFETY * job_seconds / 60)) * 2 ** (attempt - 1)


def last_request(job_seconds: float, limit: int | None) -> int:
    """Minutes the last attempt of a job asks (its retries included)."""
    return runtime_minutes(job_seconds, 1 + RETRIES, limit)


def fits_limit(job_seconds: float, limit: int | None) -> bool:
    """Whether every attempt of a job of ``job_seconds`` fits a ``limit`` (minutes; None: no
    limit).
    """
    return limit is None or last_request(job_seconds, limit) <= limit


def too_long(name: str, job_seconds: float, limit: int, where: str, fix: str) -> TooLong:
    """The one-line refusal of a job that cannot fit ``limit`` minutes of partition ``where``."""
    return TooLong(
        f"{name}: planned at {job_seconds / 60:.1f} min per job, it asks "
        f"{last_request(job_seconds, limit)} min ({RUNTIME_SAFETY:g}x, doubled on its retry) "
        f"but partition {where} allows {limit} min: {fix}"
    )


PARTITION_FIX = (
    "choose a partition with a longer time limit (--set-resources or "
    "BLOCKCOUPLING_SLURM_GPU_PARTITION / _PARTITION)"
)


def _first_shard_seconds(plan: Plan, model: str, size: int, rates: Rates) -> float | None:
    """Planned seconds of the longest extraction job of ``model`` in shards of ``size`` prompts
    (the first shard: it holds the most Jacobian prompts); token families in jobs of their own
    where the model is sharded (``Plan.token_jobs``).
    """
    entry = plan.models[model]
    shape = shape_of(entry.meta, entry.load)
    if shape is None:
        return None
    options = plan.extraction_for(model)
    count = min(size, plan.n_prompts)
    if count < plan.n_prompts and plan.extract_options(model)["token_layers"]:
        options = replace(options, token_prompts=0)
    cost = extract_cost(shape, options.for_shard(0), count, rates)
    return sum(cost["seconds"].values()) + rates.overhead


def fit_shards(plan: Plan, model: str, limit: int | None, where: str, rates: Rates) -> int | None:
    """Prompts per shard of ``model`` so that each extraction job, retry included, asks at most
    ``limit`` minutes: the configured size where it fits (None: keep it), else the largest size
    that does. Raises ``TooLong`` where one prompt's job (or a token prompt's own job, where
    the model is sharded) does not fit.
    """
    configured = min(plan.configured_shard(model) or plan.n_prompts, plan.n_prompts)
    seconds = _first_shard_seconds(plan, model, configured, rates)
    if limit is None or seconds is None:
        return None
    size = configured
    if not fits_limit(seconds, limit):
        low, high = 0, configured  # fits(low) (0: nothing yet), not fits(high)
        while high - low > 1:
            middle = (low + high) // 2
            if fits_limit(_first_shard_seconds(plan, model, middle, rates) or 0, limit):
                low = middle
            else:
                high = middle
        if low == 0:
            one = _first_shard_seconds(plan, model, 1, rates) or 0
            fix = f"{PARTITION_FIX}, or lower extract.max_tokens"
            raise too_long(f"models.{model} (extract_shard)", one, limit, where, fix)
        size = low
    entry = plan.models[model]
    shape = shape_of(entry.meta, entry.load)
    options = plan.extraction_for(model)
    token_jobs = options.token_prompts and plan.extract_options(model)["token_layers"]
    if shape is not None and size < plan.n_prompts and token_jobs:
        tokens = extract_cost(shape, replace(options, token_prompts=1), 1, rates)
        token_seconds = sum(tokens["seconds"].values()) + rates.overhead
        if not fits_limit(token_seconds, limit):
            fix = f"{PARTITION_FIX}, or lower extract.token_max_tokens or token_layers"
            raise too_long(f"models.{model} (extract_tokens)", token_seconds, limit, where, fix)
    return None if size == configured else size


def sized_plan(
    plan: Plan,
    limit_of: Callable[[str], tuple[str, int | None]],
    rates_of: Callable[[str], Rates],
) -> Plan:
    """``plan`` with every model's shards sized to its partition's time limit (``fit_shards``):
    ``limit_of(model)`` -> ``(partition, minutes or None)``, ``rates_of(model)`` -> ``Rates``.
    """
    sizes = {}
    for model in plan.models:
        where, limit = limit_of(model)
        size = fit_shards(plan, model, limit, where, rates_of(model))
        if size is not None:
            sizes[model] = size
    return replace(plan, shard_sizes=sizes)


def extract_job_seconds(
    plan: Plan, model: str, first: int | None, on_gpu: bool, gpu: Rates = GPU, cpu: Rates = CPU
) -> float | None:
    """Planned seconds of one extraction job of ``model``: the shard starting at prompt
    ``first``, or (``first`` None) one token prompt's own job; None without the model's shape.
    """
    entry = plan.models[model]
    shape = shape_of(entry.meta, entry.load)
    if shape is None:
        return None
    rates = gpu if on_gpu else cpu
    options = plan.extraction_for(model)
    if first is None:
        cost = extract_cost(shape, replace(options, token_prompts=1), 1, rates)
    else:
        if plan.token_jobs(model):
            options = replace(options, token_prompts=0)
        count = dict(plan.shards(model))[first]
        cost = extract_cost(shape, options.for_shard(first), count, rates)
    return sum(cost["seconds"].values()) + rates.overhead
