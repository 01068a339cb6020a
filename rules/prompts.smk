rule sample_prompts:
    output:
        "results/prompts/{set}.jsonl",
    params:
        spec=lambda wildcards: config["prompts"]["sets"][wildcards.set],
        n_per_source=config["prompts"].get("n_per_source", 4),
        seed=config["prompts"].get("seed", 0),
    log:
        "logs/sample_prompts/{set}.log",
    benchmark:
        "benchmarks/sample_prompts/{set}.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/sample_prompts.py"
