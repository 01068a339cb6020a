# Generalization measures that need no leaderboard: bits per byte on held-out text, and
# multiple-choice accuracy by log-likelihood on the prompts that carry answers.
rule heldout_text:
    """Held-out Shakespeare text that bits per byte is scored on."""
    output:
        "results/evaluate/heldout.txt",
    log:
        "logs/evaluate/heldout_text.log",
    benchmark:
        "benchmarks/evaluate/heldout_text.tsv"
    conda:
        "../envs/torch.yaml"
    resources:
        **JOBS.own(),
    params:
        chars=PLAN.heldout_chars,
        code=script_hash("heldout_text"),
    script:
        "../scripts/heldout_text.py"


rule evaluate:
    """Score one model at one step: bits per byte, multiple-choice accuracy."""
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
    wildcard_constraints:
        model=constraint(set(PLAN.models) - set(PLAN.run_models)),  # theirs: extract_run_<run>
    retries: 1  # a node fault or a run past its time (retried on twice the time)
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("extract")
    resources:
        **JOBS.resources("evaluate"),
        gpu_mem_gb=gpu_mem,
        device=model_device,
    params:
        math_threads=PLAN.threads("extract"),  # the numbers follow it: a change re-runs
        model=model_params,
        context_length=PLAN.context_length,
        code=script_hash("evaluate"),
    script:
        "../scripts/evaluate.py"
