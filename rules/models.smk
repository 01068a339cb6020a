# Models whose package assembles its file on demand (chunked GGUF packages).
rule assemble_model:
    output:
        "results/models/{model}.gguf",
    log:
        "logs/assemble_model/{model}.log",
    benchmark:
        "benchmarks/assemble_model/{model}.tsv"
    conda:
        "../envs/torch.yaml"
    params:
        package=lambda wildcards: PLAN.models[wildcards.model].source["package"],
        code=script_hash("assemble_model"),
    script:
        "../scripts/assemble_model.py"
