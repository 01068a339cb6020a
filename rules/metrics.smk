# m_K for the configured K list, readings and norms, from the stored statistics: changing them
# re-runs this and what follows, never the Jacobians.
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
        code=script_hash("metrics"),
    script:
        "../scripts/metrics.py"
