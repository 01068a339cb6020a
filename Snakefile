# blockcoupling: transformer block coupling and generalization, end to end.
#   snakemake --cores 2                                   (the embedded default, CPU, no hub)
#   snakemake --profile slurm --configfile config/paper.yaml   (the paper suite, on Slurm)
import os
import sys

from snakemake.utils import min_version

from blockcoupling.coupling.registry import caption_list
from blockcoupling.lm.hub import adopt_all
from blockcoupling.pipeline.report_text import report_models
from blockcoupling.pipeline.docs_figures import config_hash
from blockcoupling.pipeline.figure_stamp import CONFIG_HASH_ENV
from blockcoupling.pipeline.schema_check import validate_config
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.running import another_run

min_version("9.0")


# config.yaml is the default config: a --configfile replaces it instead of being merged into it
# (Snakemake would merge), so `--configfile config/smoke.yaml` runs exactly the smoke DAG.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# A second run beside a running one: one line, before Snakemake reads the running jobs'
# incomplete outputs as a killed run's and advises --rerun-incomplete.
if workflow.is_main_process and (_running := another_run(os.getcwd(), sys.argv)):
    sys.exit(f"snakemake: {_running}")


# Nested --config values arrive as strings ('stats={k: 5}' gives k "5"): validate_config gives
# them the schema's types first.
try:
    validate_config(
        config,
        os.path.join(workflow.basedir, "schemas", "config.schema.yaml"),
        overrides=workflow.config_settings.config,
    )
except ConfigError as error:
    sys.exit(f"config error: {error}")
# the config as read (schema defaults in), for the figures' provenance stamp (scripts/figure.py)
os.environ[CONFIG_HASH_ENV] = config_hash(config)


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/fetch.smk"
include: "rules/prompts.smk"
include: "rules/models.smk"
include: "rules/train.smk"
include: "rules/runs.smk"
include: "rules/extract.smk"
include: "rules/metrics.smk"
include: "rules/evaluate.smk"
include: "rules/combine.smk"
include: "rules/stats.smk"
include: "rules/vit.smk"
include: "rules/figures.smk"


check_params()  # every param is one Snakemake compares: a changed one re-runs its rule

# The report's opening text (report/workflow.rst) names every measured model, and the captions
# listing measures name the registry's: templates see only the config, so the texts resolved
# from the plan and the registry join it (keys the schema refuses as input).
config["report_models"] = report_models(PLAN)
config["report_measures"] = caption_list()


onstart:
    try:  # jobs going to Slurm: stop before any if a model's job fits no node
        check_slurm_jobs(PLAN, JOBS, workflow.resource_settings.max_threads)
    except SetupError as error:
        sys.exit(str(error))
    for line in adopt_all(HUB.lock_file, PLAN.fetches()) if HUB.lock_file else []:
        print(f"warning: {line}", file=sys.stderr)  # a deleted lock written again


rule all:
    """Every result of the config: extraction, metrics, statistics, figures."""
    default_target: True
    input:
        PLAN.targets() + FIGURE_TARGETS,
