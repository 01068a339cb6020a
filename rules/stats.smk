# statsmodels analyses: coupling vs generalization and hyperparameters (tidy CSV + NetCDF).
if PLAN.cross_model:

    rule stats:
        """Statistics across models: coupling vs generalization and hyperparameters."""
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
            model_coupling="results/stats/model_coupling.nc",
        log:
            "logs/stats/stats.log",
        benchmark:
            "benchmarks/stats/stats.tsv"
        group:
            job_group("stats")
        conda:
            "../envs/analysis.yaml"
        params:
            selection=PLAN.selection,
            runs=list(PLAN.train_runs),
            models={
                name: entry.source["train"]
                for name, entry in PLAN.cross_model.items()
                if entry.is_trained_here
            },
            n_boot=config["stats"]["n_boot"],
            seed=config["stats"]["seed"],
            score=config["evaluate"]["score"],
            primary=list(config["stats"]["primary"]),
            calibration_ks=sorted({PLAN.selection["k"], max(config["metrics"]["ks"])}),
            code=script_hash("stats"),
        script:
            "../scripts/stats.py"


if PLAN.checkpoint_models:

    rule stats_checkpoints:
        """Statistics over training checkpoints: emergence of coupling."""
        input:
            coupling="results/combined/checkpoints/coupling.nc",
            trajectories="results/combined/checkpoints/trajectories.nc",
            histories=[f"results/train/{run}/history.csv" for run in PLAN.train_runs],
        output:
            table="results/stats/checkpoint_table.csv",
            correlations="results/stats/checkpoint_correlations.csv",
            emergence="results/stats/checkpoint_emergence.csv",
            analyses="results/stats/emergence.csv",
        log:
            "logs/stats/checkpoints.log",
        benchmark:
            "benchmarks/stats/checkpoints.tsv"
        group:
            job_group("stats_checkpoints")
        conda:
            "../envs/analysis.yaml"
        params:
            selection=PLAN.selection,
            runs=list(PLAN.train_runs),
            models={
                name: entry.source["train"]
                for name, entry in PLAN.checkpoint_models.items()
                if entry.is_trained_here
            },
            n_boot=config["stats"]["n_boot"],
            seed=config["stats"]["seed"],
            primary=list(config["stats"]["primary"]),
            peak_step=config["stats"]["peak_step"],
            code=script_hash("stats_checkpoints"),
        script:
            "../scripts/stats_checkpoints.py"


if PLAN.analysis_tables():

    rule stats_claims:
        """One row per paper claim with its verdict (claims.csv, claims.md)."""
        input:
            tables=PLAN.analysis_tables(),
            calibration=["results/stats/calibration.csv"] if PLAN.cross_model else [],
            power=PLAN.config["stats"]["power_file"],
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
        params:
            primary=config["stats"]["primary"],
            k=PLAN.selection["k"],
            grids=sorted(
                {
                    grid.get("family") or name
                    for name, grid in (config["train"].get("grids") or {}).items()
                }
            ),
            code=script_hash("stats_claims"),
        script:
            "../scripts/stats_claims.py"
