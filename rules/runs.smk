# Models trained here are extracted per run: one job extracts every model and step of a run
# (extract_run_<run>, and scores its final models), one computes their measures (metrics_<run>,
# rules/metrics.smk).
# Each writes exactly the files of the per-model rules (extract, evaluate, metrics), which the
# other models keep: for a width-64 model the start-up of a job (~10 s of imports) is ten times
# its Jacobians.


def run_job(model, step):
    """What one (model, step) of a run's jobs needs: its load spec, extract options, files."""
    entry = Namespace(model=model, step=step)
    scored = model in PLAN.evaluated(PLAN.models) and step in PLAN.models[model].scored_steps
    return {
        "where": f"model {model}, step {step}",
        "model": model_params(entry),
        "extract": science_params(PLAN.extract_options(model)),
        "extracted": {k: f"results/extract/{model}/{step}/{k}.nc" for k in EXTRACTED},
        "evaluation": f"results/evaluate/{model}/{step}.nc" if scored else None,
    }


for _run in sorted({PLAN.models[m].source["train"] for m in PLAN.run_models}):
    _measured = PLAN.run_measured(_run)
    _jobs = [run_job(m, s) for m, s in _measured]
    _scored = [job["evaluation"] for job in _jobs if job["evaluation"]]

    rule:
        f"""Stage extract_run_{{run}} for run {_run}: extract and score its models and steps."""
        name:
            f"extract_run_{rule_suffix(_run)}"
        input:
            prompts=prompt_file(),
            heldout=["results/evaluate/heldout.txt"] if _scored else [],
            checkpoints=sorted(
                {path for m, s in _measured for path in model_inputs(Namespace(model=m, step=s))}
            ),
        output:
            [path for job in _jobs for path in job["extracted"].values()] + _scored,
        log:
            f"logs/extract_run/{_run}.log",
        benchmark:
            f"benchmarks/extract_run/{_run}.tsv"
        retries: 1  # a node fault or a run past its time (retried on twice the time)
        conda:
            "../envs/torch.yaml"
        threads: PLAN.threads("extract")
        resources:
            **JOBS.own(TRAIN_MEM_MB, TRAIN_RUNTIME),
            device=device_of(_measured[0][0]),  # changes no result: not a param
            vjp_chunk=PLAN.extraction.chunk_size or 0,  # likewise
        params:
            math_threads=PLAN.threads("extract"),  # the numbers follow it: a change re-runs
            jobs=_jobs,
            context_length=PLAN.context_length,
            code=script_hash("extract_run"),
        script:
            "../scripts/extract_run.py"
