rule sample_prompts:
    input:
        lambda wildcards: (
            [config["prompts"]["sets"][wildcards.set]["file"]]
            if "file" in config["prompts"]["sets"][wildcards.set]
            else []
        ),
    output:
        "results/prompts/{set}.jsonl",
    log:
        "logs/sample_prompts/{set}.log",
    benchmark:
        "benchmarks/sample_prompts/{set}.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        spec=lambda wildcards: config["prompts"]["sets"][wildcards.set],
        n_per_source=config["prompts"].get("n_per_source", 4),
        seed=config["prompts"].get("seed", 0),
    script:
        "../scripts/sample_prompts.py"
