# Models whose package assembles its file on demand (chunked GGUF packages).
rule assemble_model:
    output:
        "results/models/{model}.gguf",
    params:
        package=lambda wildcards: MODELS[wildcards.model].source["package"],
    log:
        "logs/assemble_model/{model}.log",
    benchmark:
        "benchmarks/assemble_model/{model}.tsv"
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/assemble_model.py"
