# One dataset per metric across models (dims model x init) and across checkpoints (model x step).
rule combine_models:
    input:
        lambda wildcards: combined_inputs(CROSS_MODEL, wildcards.name),
    output:
        "results/combined/{name}.nc",
    log:
        "logs/combine/{name}.log",
    benchmark:
        "benchmarks/combine/{name}.tsv"
    wildcard_constraints:
        name="|".join(COMBINED_NAMES),
    conda:
        "../envs/analysis.yaml"
    params:
        parts=lambda wildcards: model_steps(combine_entries(CROSS_MODEL, wildcards.name)),
        meta={name: entry.meta for name, entry in CROSS_MODEL.items()},
        along="init",
    script:
        "../scripts/combine.py"


rule combine_checkpoints:
    input:
        lambda wildcards: combined_inputs(CHECKPOINT_MODELS, wildcards.name),
    output:
        "results/combined/checkpoints/{name}.nc",
    log:
        "logs/combine/checkpoints_{name}.log",
    benchmark:
        "benchmarks/combine/checkpoints_{name}.tsv"
    wildcard_constraints:
        name="|".join(CHECKPOINT_NAMES),
    conda:
        "../envs/analysis.yaml"
    params:
        parts=lambda wildcards: model_steps(combine_entries(CHECKPOINT_MODELS, wildcards.name)),
        meta={name: entry.meta for name, entry in CHECKPOINT_MODELS.items()},
        along="step",
    script:
        "../scripts/combine.py"
