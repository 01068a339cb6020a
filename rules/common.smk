# The checked config (one Plan, built and checked before any job), input functions and code
# hashes. Every rules file reads only PLAN and the functions defined here.
import os
import re
import sys

from blockcoupling.workflow import (
    EXTRACTED,
    RANDOM,
    STATS_TABLES,
    VIT_STATS_TABLES,
    ConfigError,
    check_config,
    code_hash,
    figure_registry,
    science_params,
)
from blockcoupling.vit_config import science_extract as vit_science_extract

try:
    PLAN = check_config(config, workflow.basedir)
except ConfigError as error:
    sys.exit(f"config error: {error}")


def script_hash(name):
    """Hash of the library modules scripts/<name>.py imports (a param: edits re-run the rule)."""
    return code_hash(os.path.join(workflow.basedir, "scripts", f"{name}.py"))


def constraint(names):
    """A wildcard constraint matching exactly these names (nothing when there are none)."""
    return "|".join(re.escape(name) for name in sorted(names)) or "__none__"


wildcard_constraints:
    model=constraint(PLAN.models),
    step=r"final|random|\d+",


def prompt_file(wildcards=None):
    return f"results/prompts/{PLAN.prompt_set}.jsonl"


def model_inputs(wildcards):
    """Files a model needs at a step: an assembled GGUF, or a trained checkpoint."""
    entry = PLAN.models[wildcards.model]
    if entry.source.get("assemble"):
        return [f"results/models/{wildcards.model}.gguf"]
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
        source = {"path": f"results/models/{wildcards.model}.gguf"}
    return {
        "name": entry.name,
        "source": source,
        "load": {key: value for key, value in entry.load.items() if key != "device"},
        "random_twin": wildcards.step == RANDOM,
        "twin_seed": config["random_init"]["seed"],
    }


def model_device(wildcards):
    return PLAN.models[wildcards.model].load.get("device", config["extract"]["device"])


def gpu_mem(wildcards):
    return PLAN.models[wildcards.model].resources.get("gpu_mem_gb", 0)


def mem_mb(wildcards):
    return PLAN.models[wildcards.model].resources.get("mem_mb", 8000)
