# Block Jacobians, SVDs and exact coupling statistics, per model and step (final, random, or a
# checkpoint step). The slow stage: everything downstream reuses its files. Device, threads and
# the VJP chunk size are resources: they change no result, so changing them re-runs nothing.
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
    conda:
        "../envs/torch.yaml"
    threads: config["extract"]["threads"]
    resources:
        **model_job_resources("extract"),
        gpu_mem_gb=gpu_mem,
        device=model_device,
        vjp_chunk=config["extract"]["chunk_size"] or 0,
    params:
        model=model_params,
        extract=science_params(config["extract"]),
        code=script_hash("extract"),
    script:
        "../scripts/extract.py"
