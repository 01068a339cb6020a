# The checked config (one Plan, built and checked before any job), input functions and code
# hashes. Every rules file reads only PLAN and the functions defined here. Everything the
# workflow does once at parse time (checks, Slurm settings, the jobs' environment) is one call:
# blockcoupling.pipeline.workflow_setup.setup_workflow.
import os
import re
import sys
from types import SimpleNamespace as Namespace

from blockcoupling.jacobians.options import science_params
from blockcoupling.lm.sources import is_local_gguf
from blockcoupling.pipeline.code_hash import code_hash
from blockcoupling.pipeline.entries import RANDOM
from blockcoupling.pipeline.figure_registry import doc as figure_doc
from blockcoupling.pipeline.figure_registry import FIGURES
from blockcoupling.pipeline.job_requests import TRAIN_MEM_MB, TRAIN_RUNTIME
from blockcoupling.pipeline.plan import EXTRACTED, STATS_TABLES, VIT_STATS_TABLES
from blockcoupling.pipeline.rule_names import rule_suffix
from blockcoupling.pipeline.slurm import job_group, slurm_profile, unpolled_jobs
from blockcoupling.pipeline.workflow_setup import SetupError, check_slurm_jobs, setup_workflow
from blockcoupling.runtime import isa

SLURM_PROFILE = slurm_profile(workflow.is_main_process, sys.argv, os.environ)
# a Slurm run whose plugin would poll with a sacct that cannot answer waits forever: stop now
if SLURM_PROFILE and (_unpolled := unpolled_jobs(sys.argv, os.environ)):
    sys.exit(_unpolled)


def on_slurm():
    """Whether jobs go to Slurm, or would with this profile (a dry run with --profile slurm);
    not a local run, nor the job itself on its node. Slurm is asked nothing otherwise."""
    plugin = workflow.executor_plugin
    if plugin is not None and plugin.name == "slurm":
        return True
    return SLURM_PROFILE and (plugin is None or plugin.name == "dryrun")


try:
    SETUP = setup_workflow(
        config,
        workflow.basedir,
        os.environ,
        (
            workflow.resource_settings.default_resources,
            workflow.resource_settings.overwrite_resources,
        ),
        SLURM_PROFILE,
        workflow.is_main_process,
        on_slurm,
        workflow.resource_settings.max_threads,
    )
except SetupError as error:
    sys.exit(str(error))

PLAN = SETUP.plan
SLURM = SETUP.settings
# What each job asks Slurm for (blockcoupling.pipeline.job_requests): rules take
# JOBS.resources(rule); the Snakefile applies the defaults and the checks.
JOBS = SETUP.jobs
HUB = PLAN.hub  # the hub cache (rules/fetch.smk)
HUB_REVISIONS = PLAN.hub_revisions


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
    return PLAN.hub_folder(model, step)


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
        "twin_seed": PLAN.twin_seed if entry.twin_seed is None else entry.twin_seed,
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
    return PLAN.vit.device if model == "vit" else PLAN.device(model)


def vit_device(wildcards=None):
    return device_of("vit")


def gpu_mem(wildcards):
    return PLAN.models[wildcards.model].resources.get("gpu_mem_gb", 0)


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


def revision_done(wildcards):
    """The outputs of the jobs of the checkpoint revision before this one in its lane."""
    return PLAN.lane_before(wildcards.repo, wildcards.revision)


def extract_resources(rule):
    return dict(
        **JOBS.resources(rule),
        gpu_mem_gb=gpu_mem,
        device=model_device,
        vjp_chunk=PLAN.extraction.chunk_size or 0,
    )


def models_of(repo, revision):
    """The config keys of the models that read a hub revision ("models.a, models.b")."""
    consumers = HUB_REVISIONS[(repo, revision)].consumers
    return ", ".join(sorted({f"models.{model}" for model, _ in consumers}))


def checkpoint_folder(path):
    """A checkpoint revision's folder: kept when fetched ahead (hub.max_revisions: all), else
    temporary (deleted once its jobs are done)."""
    return path if HUB.ahead else temp(path)


# The metrics rules' files (rules/metrics.smk: the per-model rule and metrics_<run>)
def metric_files(model, step):
    """The coupling files of one model and step (what the combine rules read)."""
    return {
        "depth": f"results/metrics/{model}/{step}/coupling.nc",
        "tokens": f"results/metrics/{model}/{step}/token_coupling.nc",
    }


def metric_jobs(pairs):
    """What scripts/metrics.py computes, one entry per (model, step): its files in and out."""
    return [
        {
            "where": f"model {model}, step {step}",
            "depth": f"results/extract/{model}/{step}/depth.nc",
            "tokens": f"results/extract/{model}/{step}/tokens.nc",
            "out": metric_files(model, step),
        }
        for model, step in pairs
    ]
