# Block Jacobians, SVDs and exact coupling statistics, per model and step (final, random, or a
# checkpoint step). The slow stage: everything downstream reuses its files.
rule extract:
    input:
        prompts=prompt_file,
        model=model_inputs,
    output:
        **{name: f"results/extract/{{model}}/{{step}}/{name}.nc" for name in EXTRACTED},
    log:
        "logs/extract/{model}/{step}.log",
    benchmark:
        "benchmarks/extract/{model}/{step}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: config["extract"].get("threads", 2)
    resources:
        mem_mb=mem_mb,
        gpu_mem_gb=gpu_mem,
    params:
        model=model_params,
        extract={
            key: value
            for key, value in config["extract"].items()
            if key not in ("threads", "prompt_set")
        },
        code=EXTRACT_CODE,
    script:
        "../scripts/extract.py"
