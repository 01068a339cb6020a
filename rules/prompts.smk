# A seeded, source-stratified prompt set from a local file or hub datasets (fetched into the hub
# cache by rules/fetch.smk, read offline).
rule sample_prompts:
    input:
        file=lambda wildcards: PLAN.prompt_files[wildcards.set] or [],
        datasets=lambda wildcards: [
            HUB.dataset_folder(PROMPT_SOURCES[source]["hub"])
            for source in config["prompts"]["sets"][wildcards.set].get("hub", [])
        ],
    output:
        "results/prompts/{set}.jsonl",
    log:
        "logs/sample_prompts/{set}.log",
    benchmark:
        "benchmarks/sample_prompts/{set}.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        hub=lambda wildcards: config["prompts"]["sets"][wildcards.set].get("hub", []),
        n_per_source=config["prompts"]["n_per_source"],
        seed=config["prompts"]["seed"],
        code=script_hash("sample_prompts"),
    script:
        "../scripts/sample_prompts.py"
