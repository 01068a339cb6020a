# Generalization measures that need no leaderboard: bits per byte on held-out text, and
# multiple-choice accuracy by log-likelihood on the prompts that carry answers.
rule heldout_text:
    output:
        "results/evaluate/heldout.txt",
    log:
        "logs/evaluate/heldout_text.log",
    benchmark:
        "benchmarks/evaluate/heldout_text.tsv"
    conda:
        "../envs/torch.yaml"
    params:
        chars=config.get("evaluate", {}).get("heldout_chars", 20000),
        code=code_hash("corpus", "evaluate"),
    script:
        "../scripts/heldout_text.py"


rule evaluate:
    input:
        prompts=prompt_file,
        heldout="results/evaluate/heldout.txt",
        model=model_inputs,
    output:
        "results/evaluate/{model}/{step}.nc",
    log:
        "logs/evaluate/{model}/{step}.log",
    benchmark:
        "benchmarks/evaluate/{model}/{step}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: config["extract"].get("threads", 2)
    resources:
        mem_mb=mem_mb,
        gpu_mem_gb=gpu_mem,
    params:
        model=model_params,
        evaluate=config.get("evaluate", {}),
        code=EVALUATE_CODE,
    script:
        "../scripts/evaluate.py"
