# statsmodels analyses: coupling vs generalization and hyperparameters (tidy CSV + NetCDF).
if PLAN.cross_model:

    rule stats:
        """Statistics across models: coupling vs generalization and hyperparameters."""
        # point estimates only: nothing here depends on stats.n_boot
        input:
            coupling="results/combined/coupling.nc",
            evaluation=(
                ["results/combined/evaluation.nc"] if PLAN.evaluated(PLAN.cross_model) else []
            ),
            histories=[f"results/train/{run}/history.csv" for run in PLAN.train_runs],
            tokens=(
                ["results/combined/tokens.nc"] if "tokens" in PLAN.combined_names("init") else []
            ),
        output:
            **{name: f"results/stats/{name}.csv" for name in STATS_TABLES},
        log:
            "logs/stats/stats.log",
        benchmark:
            "benchmarks/stats/stats.tsv"
        group:
            job_group("stats")
        conda:
            "../envs/analysis.yaml"
        resources:
            **JOBS.own(),
        params:
            selection=PLAN.selection,
            runs=list(PLAN.train_runs),
            models=PLAN.cross_model_runs,
            score=PLAN.score,
            primary=list(PLAN.primary),
            calibration_ks=PLAN.calibration_ks,
            code=script_hash("stats"),
        script:
            "../scripts/stats.py"

    rule stats_summary:
        """Per-model coupling with bootstrap CIs over prompts (summary.csv, model_coupling.nc)."""
        input:
            coupling="results/combined/coupling.nc",
            evaluation=(
                ["results/combined/evaluation.nc"] if PLAN.evaluated(PLAN.cross_model) else []
            ),
        output:
            summary="results/stats/summary.csv",
            model_coupling="results/stats/model_coupling.nc",
        log:
            "logs/stats/summary.log",
        benchmark:
            "benchmarks/stats/summary.tsv"
        group:
            job_group("stats_summary")
        conda:
            "../envs/analysis.yaml"
        resources:
            **JOBS.own(),
        params:
            selection=PLAN.selection,
            bootstrap=PLAN.bootstrap,
            score=PLAN.score,
            code=script_hash("stats_summary"),
        script:
            "../scripts/stats_summary.py"


if PLAN.checkpoint_models:

    rule stats_checkpoints:
        """Statistics over training checkpoints: means, correlations, curve shapes."""
        # point estimates only: nothing here depends on stats.n_boot
        input:
            coupling="results/combined/checkpoints/coupling.nc",
            trajectories="results/combined/checkpoints/trajectories.nc",
            histories=[f"results/train/{run}/history.csv" for run in PLAN.train_runs],
        output:
            points="results/stats/checkpoint_points.csv",
            correlations="results/stats/checkpoint_correlations.csv",
            emergence="results/stats/checkpoint_emergence.csv",
        log:
            "logs/stats/checkpoints.log",
        benchmark:
            "benchmarks/stats/checkpoints.tsv"
        group:
            job_group("stats_checkpoints")
        conda:
            "../envs/analysis.yaml"
        resources:
            **JOBS.own(),
        params:
            selection=PLAN.selection,
            runs=list(PLAN.train_runs),
            models=PLAN.checkpoint_runs,
            code=script_hash("stats_checkpoints"),
        script:
            "../scripts/stats_checkpoints.py"

    rule stats_emergence:
        """Emergence of coupling: checkpoint table with bootstrap CIs, the design's tests."""
        input:
            coupling="results/combined/checkpoints/coupling.nc",
            trajectories="results/combined/checkpoints/trajectories.nc",
            histories=[f"results/train/{run}/history.csv" for run in PLAN.train_runs],
        output:
            table="results/stats/checkpoint_table.csv",
            analyses="results/stats/emergence.csv",
        log:
            "logs/stats/emergence.log",
        benchmark:
            "benchmarks/stats/emergence.tsv"
        group:
            job_group("stats_emergence")
        conda:
            "../envs/analysis.yaml"
        resources:
            **JOBS.own(),
        params:
            selection=PLAN.selection,
            runs=list(PLAN.train_runs),
            models=PLAN.checkpoint_runs,
            bootstrap=PLAN.bootstrap,
            primary=list(PLAN.primary),
            peak_step=PLAN.peak_step,
            within_window=PLAN.within_window,
            code=script_hash("stats_emergence"),
        script:
            "../scripts/stats_emergence.py"


if PLAN.analysis_tables():

    rule stats_claims:
        """One row per paper claim with its verdict (claims.csv, claims.md)."""
        input:
            tables=PLAN.analysis_tables(),
            calibration=["results/stats/calibration.csv"] if PLAN.cross_model else [],
            checkpoints=(["results/stats/checkpoint_table.csv"] if PLAN.checkpoint_models else []),
            power=PLAN.power_file,
        output:
            analyses="results/stats/analyses.csv",
            claims=report(
                "results/stats/claims.csv", caption="../report/claims.rst", category="claims"
            ),
            markdown="results/stats/claims.md",
        log:
            "logs/stats/claims.log",
        benchmark:
            "benchmarks/stats/claims.tsv"
        group:
            job_group("stats_claims")
        conda:
            "../envs/analysis.yaml"
        resources:
            **JOBS.own(),
        params:
            primary=PLAN.primary,
            k=PLAN.selection.k,
            grids=PLAN.grid_families,
            code=script_hash("stats_claims"),
        script:
            "../scripts/stats_claims.py"
