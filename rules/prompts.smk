# A seeded, source-stratified prompt set from a local file or hub datasets (fetched into the hub
# cache by rules/fetch.smk, read offline), and, when the set asks, passages of the held-out
# Shakespeare plays.
rule sample_prompts:
    """Sample the prompt set: leaderboard task styles and held-out passages."""
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
