# The checked config (one Plan, built and checked before any job), input functions and code
# hashes. Every rules file reads only PLAN and the functions defined here.
import dataclasses
import functools
import json
import os
import re
import sys

from blockcoupling.pipeline.checks import check_config, science_params
from blockcoupling.pipeline.code_hash import code_hash
from blockcoupling.pipeline.entries import RANDOM
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.figure_registry import FIGURES
from blockcoupling.pipeline.plan import EXTRACTED, STATS_TABLES, VIT_STATS_TABLES
from blockcoupling.vit.config import science_extract as vit_science_extract
from blockcoupling.runtime import isa
from blockcoupling.pipeline import cost
from blockcoupling.lm.hub import (
    HubSettings,
    hub_revisions,
    incomplete,
    missing_files,
    predecessor,
    revision_of,
)
from blockcoupling.lm.models import is_local_gguf
from blockcoupling.pipeline.slurm import (
    GROUPED_JOB_MEM_MB,
    Request,
    SlurmError,
    SlurmSettings,
    check_plan,
    job_group,
    job_needs,
    job_request,
    read_nodes,
    resource_text,
    slurm_requested,
)

try:
    PLAN = check_config(config, workflow.basedir)
    SLURM = SlurmSettings.from_env().with_resources(
        workflow.resource_settings.default_resources,
        workflow.resource_settings.overwrite_resources,
    )
except (ConfigError, SlurmError) as error:
    sys.exit(f"config error: {error}")

# Jobs go to Slurm: the shipped profile says so (profiles/slurm/config.yaml), or a site's own
# profile or --executor slurm does (slurm_requested reads them as Snakemake finds them), so that
# a dry run checks and shows what a real run would ask; a job on its node (not the main
# process) does not.
SLURM_PROFILE = workflow.is_main_process and (
    os.environ.get("BLOCKCOUPLING_SLURM_PROFILE") == "1" or slurm_requested(sys.argv, os.environ)
)
partition_nodes = functools.cache(read_nodes)
# The planner's rates of a model's jobs: GPU jobs at the GPU's, CPU jobs (and every job where
# Slurm gives no GPU, BLOCKCOUPLING_SLURM_GPU=none) at the CPU's.
JOB_RATES = cost.CPU if SLURM.gpu == "none" else cost.GPU


def partition_limit(model):
    """(partition, time limit in minutes or None) of the partition a model's jobs go to."""
    _, needs = job_needs(PLAN, "extract", model, 1)
    partition = SLURM.gpu_partition if SLURM.gpu_count(needs.gpu_mem_gb) else SLURM.partition
    try:
        nodes = partition_nodes(partition)
    except SlurmError:  # check_slurm_jobs names the setting
        return partition or "(default)", None
    if nodes is None:
        return partition or "(default)", None
    return nodes.partition, nodes.time_limit


# Shards sized to the partition's time limit (cost.fit_shards): decided by the main process
# with the slurm profile, passed to the jobs on their nodes in SHARD_SIZES (sbatch passes the
# environment), so that both see the same jobs.
SHARD_SIZES = "BLOCKCOUPLING_SHARD_SIZES"
if SLURM_PROFILE:
    try:
        PLAN = cost.sized_plan(
            PLAN,
            partition_limit,
            lambda model: JOB_RATES if PLAN.on_gpu(model) else cost.CPU,
        )
    except cost.TooLong as error:
        sys.exit(f"slurm: {error}")
    os.environ[SHARD_SIZES] = json.dumps(PLAN.shard_sizes)
elif not workflow.is_main_process and os.environ.get(SHARD_SIZES):
    PLAN = dataclasses.replace(PLAN, shard_sizes=json.loads(os.environ[SHARD_SIZES]))

# The hub cache (rules/fetch.smk): every compute job, here or on a node, runs with the hub offline
# (the variables pass to local jobs and through sbatch's environment); the fetch rules go online.
HUB = PLAN.hub
HUB_REVISIONS = {(r.repo, r.revision): r for r in hub_revisions(PLAN.models)}
os.environ.update(HUB.job_env())

# Every job's math libraries on one code path (AVX2), so that any x86-64 machine gives the same
# numbers (blockcoupling.runtime.isa; the runner refuses a job without them).
try:
    os.environ.update(isa.job_env())
except isa.ISAError as error:
    sys.exit(f"error: {error}")


def check_fetched():
    """Stop before any job, in one line, where a fetched revision folder lacks files its
    manifest lists (emptied or damaged; a job would fail on it and its retry again). A folder
    that is missing, or has no manifest, is fetched again by its rule."""
    for revision in HUB_REVISIONS.values():
        folder = HUB.folder(revision.repo, revision.revision, revision.checkpoint)
        if missing_files(folder):
            model = revision.consumers[0][0]
            sys.exit(incomplete(folder, f"models.{model}", revision.repo, revision.revision))


check_fetched()


def script_hash(name):
    """Hash of the library modules scripts/<name>.py imports (a param: edits re-run the rule),
    marked when the math libraries run unpinned (BLOCKCOUPLING_ISA=native: other numbers)."""
    code = code_hash(os.path.join(workflow.basedir, "scripts", f"{name}.py"))
    return code if isa.pinned() else f"{code}-native"


def constraint(names):
    """A wildcard constraint matching exactly these names (nothing when there are none)."""
    return "|".join(re.escape(name) for name in sorted(names)) or "__none__"


wildcard_constraints:
    model=constraint(PLAN.models),
    step=r"final|random|\d+",


def prompt_file(wildcards=None):
    return f"results/prompts/{PLAN.prompt_set}.jsonl"


def hub_folder(model, step):
    """The hub-cache folder a model reads at a step (None when not from the hub)."""
    where = revision_of(PLAN.models[model], step)
    if where is None:
        return None
    revision = HUB_REVISIONS[where[:2]]
    return HUB.folder(revision.repo, revision.revision, revision.checkpoint)


def gguf_source(model):
    """The source spec convert_gguf reads (an assembled package: its assembled file)."""
    entry = PLAN.models[model]
    if entry.source.get("assemble"):
        return {"path": f"results/models/{model}.gguf"}
    return dict(entry.source)


def converted_folder(model):
    """The converted folder of a local GGUF model (None for any other source)."""
    entry = PLAN.models[model]
    if entry.is_trained_here or not is_local_gguf(entry.source):  # hub sources are not local
        return None
    return f"results/models/{model}/converted"


def model_inputs(wildcards):
    """Files a model needs at a step: its converted GGUF, a trained checkpoint, or its fetched
    hub revision."""
    entry = PLAN.models[wildcards.model]
    if hub_folder(wildcards.model, wildcards.step):
        return [hub_folder(wildcards.model, wildcards.step)]
    if converted_folder(wildcards.model):
        return [converted_folder(wildcards.model)]
    if entry.is_trained_here:
        step = entry.train_step(wildcards.step)
        return [f"results/train/{entry.source['train']}/step{step}/model.safetensors"]
    return []


def model_params(wildcards):
    """What a job needs to load the model at this step (source, load options, twin seed); the
    device is a resource, since it changes no result."""
    entry = PLAN.models[wildcards.model]
    source = entry.source_at(wildcards.step)
    if entry.source.get("assemble"):
        source = gguf_source(wildcards.model)
    fetched = hub_folder(wildcards.model, wildcards.step)
    converted = converted_folder(wildcards.model)
    return {
        "name": entry.name,
        "source": source,
        "load": {key: value for key, value in entry.load.items() if key != "device"},
        "random_twin": wildcards.step == RANDOM,
        "twin_seed": config["random_init"]["seed"],
        **({"fetched": fetched} if fetched else {}),
        **({"converted": converted} if converted else {}),
    }


def model_device(wildcards):
    return device_of(wildcards.model)


def device_of(model):
    """A model's (or "vit": the ViT sweep's) device; CPU where its Slurm job gets no GPU
    (BLOCKCOUPLING_SLURM_GPU=none)."""
    if SLURM.gpu == "none" and on_slurm():
        return "cpu"
    return config["vit"]["device"] if model == "vit" else PLAN.device(model)


def vit_device(wildcards=None):
    return device_of("vit")


def gpu_mem(wildcards):
    return PLAN.models[wildcards.model].resources.get("gpu_mem_gb", 0)


# Rule -> (mem_mb, runtime in minutes) of a model's job when the model declares none and the
# planner cannot tell (no n_layers/d_model in its metadata).
JOB_DEFAULTS = {"extract": (8000, 720), "evaluate": (8000, 240)}
DEFAULT_RUNTIME = 60  # minutes of the other rules (apply_job_defaults)
SMALL_JOB_MEM_MB = GROUPED_JOB_MEM_MB  # memory of the other rules
# The planner's longest job per (model or "vit", rule), at the rates of the device jobs get.
PLANNED = {(row.model, row.rule): row for row in cost.plan_costs(PLAN, gpu=JOB_RATES)}


def job_defaults(rule_name, model, attempt, part=0, limit=None):
    """(mem_mb, runtime) of a job whose model declares none: runtime from the planner
    (cost.runtime_minutes: safety factor and floor, doubled on a retry; ``limit``: the
    partition's, which the floor yields to); ``part``: the first prompt of an extract_shard
    job, None for an extract_tokens job (each its own time)."""
    mem_mb, runtime = JOB_DEFAULTS.get(rule_name, (8000, 720))
    seconds = None
    if rule_name in {"extract_shard", "extract_tokens"}:
        seconds = cost.extract_job_seconds(PLAN, model, part, PLAN.on_gpu(model), JOB_RATES)
    elif (model, rule_name) in PLANNED:
        seconds = PLANNED[(model, rule_name)].job_seconds
    if seconds is None:
        return mem_mb, runtime * attempt
    return mem_mb, cost.runtime_minutes(seconds, attempt, limit)


def on_slurm():
    """Whether jobs go to Slurm, or would with this profile (a dry run with --profile slurm);
    not a local run, nor the job itself on its node. Slurm is asked nothing otherwise."""
    plugin = workflow.executor_plugin
    if plugin is not None and plugin.name == "slurm":
        return True
    return SLURM_PROFILE and (plugin is None or plugin.name == "dryrun")


@functools.cache
def slurm_request(rule, model, threads, with_nodes, attempt=1, part=0):
    """What a model's (or the ViT sweep's, model "vit") job asks Slurm for
    (blockcoupling.pipeline.slurm): memory, runtime, partition, GPUs where it runs on a GPU
    (PLAN.on_gpu, options.runs_on_gpu); checked against sinfo's nodes when jobs go to Slurm."""
    name, needs = job_needs(PLAN, rule, model, threads)
    nodes_of = partition_nodes if with_nodes else lambda partition: None
    limit = partition_limit(model)[1] if with_nodes else None
    defaults = job_defaults(rule, model, attempt, part, limit)
    request = job_request(name, needs, defaults, SLURM, nodes_of)
    if request.asked_runtime:  # a default without a planned time: capped, and said (once)
        print(
            f"slurm: {name} (attempt {attempt}) has no planned runtime (no n_layers/d_model in "
            f"its metadata): asks the partition's {request.runtime} min instead of "
            f"{request.asked_runtime}; declare resources.runtime to choose",
            file=sys.stderr,
        )
    return request


def model_job_resources(rule, model=None):
    """The Slurm resources of a model's job of ``rule`` (``model``: a fixed one, e.g. "vit";
    else the job's wildcard; 0 and '' ask for nothing; a local run ignores them all)."""

    def resource(key):
        def value(wildcards, threads, attempt):
            name = model or wildcards.model
            part = int(wildcards.shard) if "shard" in wildcards.keys() else 0
            part = None if "prompt" in wildcards.keys() else part
            request = slurm_request(rule, name, threads, on_slurm(), attempt, part)
            return request.resources(SLURM)[key]

        return value

    OWN_MEMORY.add(rule)
    return {key: resource(key) for key in Request.RESOURCES}


OWN_MEMORY = set()  # rules whose memory model_job_resources gives


def small_job_runtime(wildcards, attempt):
    """Runtime of a job without a planned one (DEFAULT_RUNTIME minutes; at most its CPU
    partition's limit on Slurm, check_runtimes says so)."""
    if not on_slurm():
        return DEFAULT_RUNTIME
    try:
        nodes = partition_nodes(SLURM.partition)
    except SlurmError:
        return DEFAULT_RUNTIME
    limit = nodes.time_limit if nodes is not None else None
    return min(DEFAULT_RUNTIME, limit or DEFAULT_RUNTIME)


# The param types Snakemake compares to decide a re-run (any other is silently left out).
COMPARED_PARAMS = (int, float, bool, str, complex, range, list, tuple, dict, set, frozenset)


def check_params():
    """Stop at parse time on a rule param that Snakemake would not compare (a typed object
    that is neither a builtin container nor a subclass of one: changing it would re-run
    nothing), or whose repr changes from run to run (an object address)."""
    for each in workflow.rules:
        for name, value in each.params.items():
            if value is None or callable(value):
                continue
            if not isinstance(value, COMPARED_PARAMS) or " at 0x" in repr(value):
                sys.exit(
                    f"rules: param {name!r} of rule {each.name} is a {type(value).__name__}, "
                    "which Snakemake does not compare, so changing it would re-run nothing: "
                    "pass a builtin, a NamedTuple or a dict subclass with a stable repr"
                )


def apply_job_defaults():
    """Give every rule the workflow's own requests where neither the rule nor the user's
    --default-resources sets them (mem_mb, runtime: what the shipped profile asked before),
    so that any Slurm profile, a site's own too, gets the same per-job requests."""
    from snakemake.resources import Resource, Resources

    keys = ("mem", "mem_mb", "mem_mib")
    user = workflow.resource_settings.default_resources
    builtin_text = Resources.DEFAULTS["full"]["mem"]  # Snakemake's own, from the input's size
    users_memory = any(resource_text(user, key) not in ("", builtin_text) for key in keys)
    for each in workflow.rules:
        given = [key for key in keys if key in each.resources.keys()]
        # a function not of model_job_resources: Snakemake's own default (from the input's
        # size); a number: the rule's own (or the user's)
        builtin = all(each.resources.get(key).is_evaluable() for key in given)
        if not users_memory and each.name not in OWN_MEMORY and builtin:
            for key in given:
                each.resources[key] = None
            each.resources["mem_mb"] = Resource("mem_mb", SMALL_JOB_MEM_MB)
        each.resources.setdefault("runtime", Resource("runtime", small_job_runtime))


def check_slurm_jobs():
    """Stop before any job if a model's job cannot run on the Slurm partition it goes to (with
    the profile: when the DAG is built, dry runs too; with --executor slurm alone: on start)."""
    if not on_slurm():
        return
    threads = min(
        config["extract"]["threads"], workflow.resource_settings.max_threads or sys.maxsize
    )
    try:
        check_plan(PLAN, SLURM, threads, partition_nodes)
        check_runtimes()
    except (SlurmError, cost.TooLong) as error:
        sys.exit(f"slurm: {error}")


def check_runtimes():
    """Raise ``cost.TooLong`` for the first job that cannot be split (evaluate, vit_train,
    vit_extract) whose planned runtime, retry included, exceeds its partition's limit; say in
    one line where the small rules' default runtime (the profile's 60 min) is capped."""
    for (model, rule_name), row in PLANNED.items():
        if rule_name == "extract":  # sized to fit (cost.fit_shards)
            continue
        where, limit = partition_limit(model)
        if not cost.fits_limit(row.job_seconds, limit):
            name = "vit" if model == "vit" else f"models.{model}"
            fix = cost.PARTITION_FIX + (", or fewer vit epochs" if rule_name == "vit_train" else "")
            raise cost.too_long(f"{name} ({rule_name})", row.job_seconds, limit, where, fix)
    try:
        nodes = partition_nodes(SLURM.partition)
    except SlurmError:
        return
    if nodes is not None and nodes.time_limit and nodes.time_limit < DEFAULT_RUNTIME:
        print(
            f"slurm: partition {nodes.partition} allows {nodes.time_limit} min: the jobs "
            f"without a planned runtime (metrics, combine, stats, figures, training) ask "
            f"{nodes.time_limit} min instead of {DEFAULT_RUNTIME}; set-resources RULE:runtime=N "
            "to choose",
            file=sys.stderr,
        )


if SLURM_PROFILE:
    check_slurm_jobs()


def revision_done(wildcards):
    """The outputs of the jobs of the checkpoint revision before this one in its lane."""
    if HUB.ahead:  # every revision fetched ahead and kept: no lanes
        return []
    revision = HUB_REVISIONS[(wildcards.repo, wildcards.revision)]
    before = predecessor(list(HUB_REVISIONS.values()), revision, HUB.max_revisions)
    if before is None:
        return []
    evaluated = PLAN.evaluated(PLAN.models)
    done = [f"results/extract/{model}/{step}/depth.nc" for model, step in before.consumers]
    done += [f"results/evaluate/{m}/{s}.nc" for m, s in before.consumers if m in evaluated]
    return done


def extract_resources(rule):
    return dict(
        **model_job_resources(rule),
        gpu_mem_gb=gpu_mem,
        device=model_device,
        vjp_chunk=config["extract"]["chunk_size"] or 0,
    )


def checkpoint_folder(path):
    """A checkpoint revision's folder: kept when fetched ahead (hub.max_revisions: all), else
    temporary (deleted once its jobs are done)."""
    return path if HUB.ahead else temp(path)
