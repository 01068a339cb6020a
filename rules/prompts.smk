# A seeded, source-stratified prompt set from a local file or hub datasets (fetched into the hub
# cache by rules/fetch.smk, read offline), and, when the set asks, passages of the held-out
# Shakespeare plays; beside them the provenance of every source (the dataset commit fetched, or
# the local file's SHA-256).
HUB_DATASET_OF = {  # source -> (repo, revision)
    source: (PROMPT_SOURCES[source]["hub"], HUB_DATASETS[PROMPT_SOURCES[source]["hub"]][1])
    for spec in config["prompts"]["sets"].values()
    for source in spec.get("hub", [])
}


rule sample_prompts:
    """Sample the prompt set: leaderboard task styles and held-out passages."""
    input:
        file=lambda wildcards: PLAN.prompt_files[wildcards.set] or [],
        datasets=lambda wildcards: [
            HUB.dataset_folder(*HUB_DATASET_OF[source])
            for source in config["prompts"]["sets"][wildcards.set].get("hub", [])
        ],
        manifests=lambda wildcards: [
            HUB.manifest("dataset", *HUB_DATASET_OF[source])
            for source in config["prompts"]["sets"][wildcards.set].get("hub", [])
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
    params:
        hub=lambda wildcards: config["prompts"]["sets"][wildcards.set].get("hub", []),
        revisions=lambda wildcards: {  # a changed pin re-runs the sampling
            source: HUB_DATASET_OF[source][1]
            for source in config["prompts"]["sets"][wildcards.set].get("hub", [])
        },
        shakespeare=lambda wildcards: (
            {
                "n": config["prompts"]["sets"][wildcards.set]["shakespeare"],
                "skip_chars": config["evaluate"]["heldout_chars"],
                "chars": config["prompts"]["passage_chars"],
            }
            if config["prompts"]["sets"][wildcards.set].get("shakespeare")
            else None
        ),
        n_per_source=config["prompts"]["n_per_source"],
        seed=config["prompts"]["seed"],
        code=script_hash("sample_prompts"),
    script:
        "../scripts/sample_prompts.py"
