# Block Jacobians, SVDs and exact coupling statistics, per model and step (final, random, or a
# checkpoint step). The slow stage: everything downstream reuses its files. Device and the VJP
# chunk size are resources (changing them re-runs nothing); the threads are a param too, since
# a job's numbers depend on its thread count (runner.math_threads).
# A model with extract.prompts_per_shard (or resources.prompts_per_shard) is extracted in prompt
# shards ({shard}: the index of its first prompt) and its token families in a job per prompt,
# merged into the same files as one job writes; the shard files are temporary (removed once
# merged).
rule extract:
    """Block Jacobians of one model at one step: SVDs, coupling statistics, trajectories."""
    input:
        prompts=prompt_file,
        model=model_inputs,
    output:
        **{kind: f"results/extract/{{model}}/{{step}}/{kind}.nc" for kind in EXTRACTED},
    log:
        "logs/extract/{model}/{step}.log",
    benchmark:
        "benchmarks/extract/{model}/{step}.tsv"
    wildcard_constraints:
        model=constraint(set(PLAN.sharded(False)) - set(PLAN.run_models)),
    retries: 1  # a node fault or a run past its time (retried on twice the time)
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("extract")
    resources:
        **extract_resources("extract"),
    params:
        math_threads=PLAN.threads("extract"),  # the numbers follow it: a change re-runs
        model=model_params,
        extract=lambda wildcards: science_params(PLAN.extract_options(wildcards.model)),
        shard=None,
        code=script_hash("extract"),
    script:
        "../scripts/extract.py"


rule extract_shard:
    """Depth-wise Jacobians and trajectories of one prompt shard of a model."""
    input:
        prompts=prompt_file,
        model=model_inputs,
    output:
        **{
            kind: temp(f"results/extract/{{model}}/{{step}}/shards/{{shard}}/{kind}.nc")
            for kind in EXTRACTED
        },
    log:
        "logs/extract/{model}/{step}/shard{shard}.log",
    benchmark:
        "benchmarks/extract/{model}/{step}/shard{shard}.tsv"
    wildcard_constraints:
        model=constraint(PLAN.sharded(True)),
        shard=r"\d+",
    retries: 1  # a node fault or a run past its time (retried on twice the time)
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("extract")
    resources:
        **extract_resources("extract_shard"),
    params:
        math_threads=PLAN.threads("extract"),  # the numbers follow it: a change re-runs
        model=model_params,
        extract=lambda wildcards: science_params(PLAN.extract_options(wildcards.model)),
        shard=lambda wildcards: {
            "first": int(wildcards.shard),
            "count": dict(PLAN.shards(wildcards.model))[int(wildcards.shard)],
            "token_families": not PLAN.token_jobs(wildcards.model),
        },
        code=script_hash("extract"),
    script:
        "../scripts/extract.py"


rule extract_tokens:
    """Token-family Jacobians of one prompt of a sharded model."""
    input:
        prompts=prompt_file,
        model=model_inputs,
    output:
        tokens=temp("results/extract/{model}/{step}/shards/tokens/{prompt}/tokens.nc"),
    log:
        "logs/extract/{model}/{step}/tokens{prompt}.log",
    benchmark:
        "benchmarks/extract/{model}/{step}/tokens{prompt}.tsv"
    wildcard_constraints:
        model=constraint(PLAN.sharded(True)),
        prompt=r"\d+",
    retries: 1  # a node fault or a run past its time (retried on twice the time)
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("extract")
    resources:
        **extract_resources("extract_tokens"),
    params:
        math_threads=PLAN.threads("extract"),  # the numbers follow it: a change re-runs
        model=model_params,
        extract=lambda wildcards: science_params(PLAN.extract_options(wildcards.model)),
        shard=lambda wildcards: {
            "first": int(wildcards.prompt),
            "count": 1,
            "token_families": True,
        },
        code=script_hash("extract"),
    script:
        "../scripts/extract.py"


rule merge_shards:
    """Merge a sharded model's prompt shards into the files one extract job writes."""
    input:
        lambda wildcards: [
            path
            for paths in PLAN.shard_parts(wildcards.model, wildcards.step).values()
            for path in paths
        ],
    output:
        **{kind: f"results/extract/{{model}}/{{step}}/{kind}.nc" for kind in EXTRACTED},
    log:
        "logs/extract/{model}/{step}.log",
    benchmark:
        "benchmarks/extract/{model}/{step}.tsv"
    wildcard_constraints:
        model=constraint(PLAN.sharded(True)),
    conda:
        "../envs/analysis.yaml"
    resources:
        **JOBS.own(),
    params:
        parts=lambda wildcards: PLAN.shard_parts(wildcards.model, wildcards.step),
        code=script_hash("merge_shards"),
    script:
        "../scripts/merge_shards.py"
