# m_K for the configured K list, readings and norms, from the stored statistics: changing them
# re-runs these rules and what follows, never the Jacobians. The one route of the metrics
# section (metrics.ks, ...) to the metric code: PLAN.metric -> these rules' params ->
# scripts/metrics.py -> files.metric_files.write_metrics -> coupling.metrics.coupling_dataset.
# Before the first job the checks ask that same MetricConfig, through its own methods
# (check_extractable; over_chance in k_warnings); extraction stores its statistics at those Ks
# (extract.stored_ks: metrics) and stats.k must be one of them.


rule metrics:
    """Coupling measures (m_K, excess, overlaps) of one model and step for every K."""
    input:
        depth="results/extract/{model}/{step}/depth.nc",
        tokens="results/extract/{model}/{step}/tokens.nc",
    output:
        depth="results/metrics/{model}/{step}/coupling.nc",
        tokens="results/metrics/{model}/{step}/token_coupling.nc",
    log:
        "logs/metrics/{model}/{step}.log",
    benchmark:
        "benchmarks/metrics/{model}/{step}.tsv"
    wildcard_constraints:
        model=constraint(set(PLAN.models) - set(PLAN.run_models)),  # theirs: metrics_<run>
    group:
        job_group("metrics")
    conda:
        "../envs/analysis.yaml"
    resources:
        **JOBS.own(),
    params:
        metrics=PLAN.metric,
        jobs=lambda wildcards: metric_jobs([(wildcards.model, wildcards.step)]),
        code=script_hash("metrics"),
    script:
        "../scripts/metrics.py"


# Models trained here: one job computes the measures of every model and step of a run (the
# files of the rule above), after extract_run_<run> (rules/runs.smk) extracted them.
for _run in sorted({PLAN.models[m].source["train"] for m in PLAN.run_models}):
    _jobs = metric_jobs(PLAN.run_measured(_run))

    rule:
        f"""Stage metrics_{{run}} for run {_run}: coupling measures of its models and steps."""
        name:
            f"metrics_{rule_suffix(_run)}"
        input:
            [path for job in _jobs for path in (job["depth"], job["tokens"])],
        output:
            [path for job in _jobs for path in job["out"].values()],
        log:
            f"logs/metrics/{_run}.log",
        benchmark:
            f"benchmarks/metrics/{_run}.tsv"
        conda:
            "../envs/analysis.yaml"
        resources:
            **JOBS.own(),
        params:
            metrics=PLAN.metric,
            jobs=_jobs,
            code=script_hash("metrics"),
        script:
            "../scripts/metrics.py"
