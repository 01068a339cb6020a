# Block Jacobians, SVDs and exact coupling statistics, per model and step (final, random, or a
# checkpoint step). The slow stage: everything downstream reuses its files. Device, threads and
# the VJP chunk size are resources: they change no result, so changing them re-runs nothing.
# A model with extract.prompts_per_shard (or resources.prompts_per_shard) is extracted in prompt
# shards ({shard}: the index of its first prompt) merged into the same files as one job writes.
EXTRACT_RESOURCES = dict(
    mem_mb=mem_mb,
    gpu_mem_gb=gpu_mem,
    device=model_device,
    vjp_chunk=config["extract"]["chunk_size"] or 0,
)


rule extract:
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
        model=constraint(PLAN.sharded(False)),
    conda:
        "../envs/torch.yaml"
    threads: config["extract"]["threads"]
    resources:
        **EXTRACT_RESOURCES,
    params:
        model=model_params,
        extract=lambda wildcards: science_params(PLAN.extract_options(wildcards.model)),
        shard=None,
        code=script_hash("extract"),
    script:
        "../scripts/extract.py"


rule extract_shard:
    input:
        prompts=prompt_file,
        model=model_inputs,
    output:
        **{
            kind: f"results/extract/{{model}}/{{step}}/shards/{{shard}}/{kind}.nc"
            for kind in EXTRACTED
        },
    log:
        "logs/extract/{model}/{step}/shard{shard}.log",
    benchmark:
        "benchmarks/extract/{model}/{step}/shard{shard}.tsv"
    wildcard_constraints:
        model=constraint(PLAN.sharded(True)),
        shard=r"\d+",
    conda:
        "../envs/torch.yaml"
    threads: config["extract"]["threads"]
    resources:
        **EXTRACT_RESOURCES,
    params:
        model=model_params,
        extract=lambda wildcards: science_params(PLAN.extract_options(wildcards.model)),
        shard=lambda wildcards: (
            int(wildcards.shard),
            dict(PLAN.shards(wildcards.model))[int(wildcards.shard)],
        ),
        code=script_hash("extract"),
    script:
        "../scripts/extract.py"


rule merge_shards:
    input:
        lambda wildcards: [
            f"results/extract/{wildcards.model}/{wildcards.step}/shards/{first}/{kind}.nc"
            for first, _ in PLAN.shards(wildcards.model)
            for kind in EXTRACTED
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
    params:
        kinds=list(EXTRACTED),
        code=script_hash("merge_shards"),
    script:
        "../scripts/merge_shards.py"
