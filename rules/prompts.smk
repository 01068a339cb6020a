# A seeded, source-stratified prompt set from a local file or hub datasets (fetched into the hub
# cache by rules/fetch.smk, read offline), and, when the set asks, passages of the held-out
# Shakespeare plays; beside them the provenance of every source (the dataset commit fetched, or
# the local file's SHA-256).
from blockcoupling.lm.text.prompts import SOURCES as PROMPT_SOURCES

HUB_DATASET_OF = {  # source -> (repo, revision)
    source: (PROMPT_SOURCES[source]["hub"], revision)
    for source, revision in PLAN.prompt_hub_sources()
}


rule sample_prompts:
    """Sample the prompt set: leaderboard task styles and held-out passages."""
    input:
        file=lambda wildcards: PLAN.prompt_files[wildcards.set] or [],
        datasets=lambda wildcards: [
            HUB.dataset_folder(*HUB_DATASET_OF[source])
            for source in PLAN.prompt_hub(wildcards.set)
        ],
        manifests=lambda wildcards: [
            HUB.manifest("dataset", *HUB_DATASET_OF[source])
            for source in PLAN.prompt_hub(wildcards.set)
        ],
    output:
        prompts="results/prompts/{set}.jsonl",
        provenance="results/prompts/{set}.provenance.json",
    log:
        "logs/sample_prompts/{set}.log",
    benchmark:
        "benchmarks/sample_prompts/{set}.tsv"
    conda:
        "../envs/analysis.yaml"
    resources:
        **JOBS.own(),
    params:
        hub=lambda wildcards: PLAN.prompt_hub(wildcards.set),
        revisions=lambda wildcards: {  # a changed pin re-runs the sampling
            source: HUB_DATASET_OF[source][1] for source in PLAN.prompt_hub(wildcards.set)
        },
        shakespeare=lambda wildcards: PLAN.shakespeare(wildcards.set),
        n_per_source=PLAN.prompt_sampling[0],
        seed=PLAN.prompt_sampling[1],
        code=script_hash("sample_prompts"),
    script:
        "../scripts/sample_prompts.py"
