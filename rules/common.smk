# Input functions, target lists and config checks shared by the rules.
import os
import sys

from blockcoupling.models import parse_source
from blockcoupling.workflow import RANDOM, code_hash, model_entries, train_steps


def config_error(message):
    sys.exit(f"config error: {message}")


def resource_path(path):
    """A relative path is taken from the working directory, else from the workflow's folder
    (the files shipped with it, e.g. resources/prompts/default.jsonl)."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    return os.path.join(workflow.basedir, path)


if config.get("model_table"):
    config["model_table"] = resource_path(config["model_table"])
for _set in config["prompts"]["sets"].values():
    if "file" in _set:
        _set["file"] = resource_path(_set["file"])
        if not os.path.isfile(_set["file"]):
            config_error(f"prompt file {_set['file']!r} does not exist")

try:
    MODELS = model_entries(config)
except ValueError as error:
    config_error(error)

PROMPT_SET = config["extract"]["prompt_set"]
if PROMPT_SET not in config["prompts"]["sets"]:
    config_error(
        f"extract.prompt_set {PROMPT_SET!r} is not under prompts.sets ({', '.join(config['prompts']['sets'])})"
    )
K_MAX = config["extract"].get("k_max", 50)
for _k in config["metrics"]["ks"]:
    if _k > K_MAX:
        config_error(f"metrics.ks has K={_k} > extract.k_max={K_MAX}")
if config.get("stats", {}).get("k", config["metrics"]["ks"][0]) not in config["metrics"]["ks"]:
    config_error(f"stats.k={config['stats']['k']} is not in metrics.ks {config['metrics']['ks']}")
for _name, _entry in MODELS.items():
    if "train" not in _entry.source:
        try:
            parse_source(_entry.source)
        except ValueError as error:
            config_error(f"models.{_name}.source: {error}")
TRAIN_RUNS = config.get("train", {}).get("runs", {})
TRAIN_STEPS = {run: train_steps(spec) for run, spec in TRAIN_RUNS.items()}
EVALUATE = config.get("evaluate", {}).get("enabled", True)

CROSS_MODEL = {name: e for name, e in MODELS.items() if not e.is_checkpoint_suite}
CHECKPOINT_MODELS = {name: e for name, e in MODELS.items() if e.is_checkpoint_suite}
EXTRACTED = ("depth", "spectra", "tokens", "trajectories")
# Trained checkpoint suites carry their own generalization measure (validation loss in the
# training history); hub checkpoint suites get the evaluate rule.
HUB_CHECKPOINT_MODELS = {
    name: e for name, e in CHECKPOINT_MODELS.items() if "train" not in e.source
}
COMBINED_NAMES = ("coupling", "tokens", "trajectories", "spectra") + (
    ("evaluation",) if EVALUATE else ()
)
CHECKPOINT_NAMES = ("coupling", "trajectories") + (
    ("evaluation",) if EVALUATE and HUB_CHECKPOINT_MODELS else ()
)
COMBINE_SOURCES = {
    "coupling": "results/metrics/{model}/{step}/coupling.nc",
    "tokens": "results/metrics/{model}/{step}/token_coupling.nc",
    "trajectories": "results/extract/{model}/{step}/trajectories.nc",
    "spectra": "results/extract/{model}/{step}/spectra.nc",
    "evaluation": "results/evaluate/{model}/{step}.nc",
}

# Code hashes: Snakemake's code trigger sees only a rule's script file, not the library it imports.
EXTRACT_CODE = code_hash(
    "capture", "jacobians", "spectral", "coupling", "trajectories", "measure", "models"
)
METRIC_CODE = code_hash("coupling", "metrics")
EVALUATE_CODE = code_hash("evaluate", "corpus", "models")
STATS_CODE = code_hash("stats")
FIGURE_CODE = code_hash("figures")
TRAIN_CODE = code_hash("train", "corpus")


wildcard_constraints:
    model="|".join(sorted(MODELS)) or "__none__",
    step=r"final|random|\d+",
    run="|".join(sorted(TRAIN_RUNS)) or "__none__",


def model_steps(entries):
    return [(name, step) for name, entry in entries.items() for step in entry.steps]


def prompt_file(wildcards=None):
    return f"results/prompts/{PROMPT_SET}.jsonl"


def model_inputs(wildcards):
    """Files a model needs at a step: an assembled GGUF, or a trained checkpoint."""
    entry = MODELS[wildcards.model]
    if entry.source.get("assemble"):
        return [f"results/models/{wildcards.model}.gguf"]
    if "train" in entry.source:
        return [
            f"results/train/{entry.source['train']}/step{entry.train_step(wildcards.step)}/model.safetensors"
        ]
    return []


def model_params(wildcards):
    """What a rule needs to load the model at this step (source, load options, twin seed)."""
    entry = MODELS[wildcards.model]
    source = entry.source_at(wildcards.step)
    if entry.source.get("assemble"):
        source = {"path": f"results/models/{wildcards.model}.gguf"}
    return {
        "name": entry.name,
        "source": source,
        "load": {"device": config["extract"].get("device", "cpu"), **entry.load},
        "random_twin": wildcards.step == RANDOM,
        "twin_seed": config.get("random_init", {}).get("seed", 0),
        "meta": entry.meta,
    }


def gpu_mem(wildcards):
    return MODELS[wildcards.model].resources.get("gpu_mem_gb", 0)


def mem_mb(wildcards):
    return MODELS[wildcards.model].resources.get("mem_mb", 8000)


def combine_entries(entries, name):
    """The models a combined file gathers: evaluation only where the evaluate rule runs."""
    if name == "evaluation":
        return {
            model: e
            for model, e in entries.items()
            if "train" not in e.source or not e.is_checkpoint_suite
        }
    return entries


def combined_inputs(entries, name):
    pattern = COMBINE_SOURCES[name]
    return [
        pattern.format(model=model, step=step)
        for model, step in model_steps(combine_entries(entries, name))
    ]


def final_targets():
    targets = list(figure_targets())
    if CROSS_MODEL:
        targets.append("results/stats/summary.csv")
    if CHECKPOINT_MODELS:
        targets.append("results/stats/checkpoint_correlations.csv")
    targets += [f"results/combined/{name}.nc" for name in COMBINED_NAMES if CROSS_MODEL]
    targets += [
        f"results/combined/checkpoints/{name}.nc" for name in CHECKPOINT_NAMES if CHECKPOINT_MODELS
    ]
    return targets
