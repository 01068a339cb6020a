# statsmodels analyses: coupling vs generalization and hyperparameters (tidy CSV + NetCDF).
if PLAN.cross_model:

    rule stats:
        input:
            coupling="results/combined/coupling.nc",
            evaluation=(
                ["results/combined/evaluation.nc"] if PLAN.evaluated(PLAN.cross_model) else []
            ),
        output:
            **{name: f"results/stats/{name}.csv" for name in STATS_TABLES},
            model_coupling="results/stats/model_coupling.nc",
        log:
            "logs/stats/stats.log",
        benchmark:
            "benchmarks/stats/stats.tsv"
        conda:
            "../envs/analysis.yaml"
        params:
            selection=PLAN.selection,
            n_boot=config["stats"]["n_boot"],
            seed=config["stats"]["seed"],
            score=config["evaluate"]["score"],
            code=script_hash("stats"),
        script:
            "../scripts/stats.py"


if PLAN.checkpoint_models:

    rule stats_checkpoints:
        input:
            coupling="results/combined/checkpoints/coupling.nc",
            trajectories="results/combined/checkpoints/trajectories.nc",
            histories=[f"results/train/{run}/history.csv" for run in PLAN.train_runs],
        output:
            table="results/stats/checkpoint_table.csv",
            correlations="results/stats/checkpoint_correlations.csv",
            emergence="results/stats/checkpoint_emergence.csv",
        log:
            "logs/stats/checkpoints.log",
        benchmark:
            "benchmarks/stats/checkpoints.tsv"
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
            code=script_hash("stats_checkpoints"),
        script:
            "../scripts/stats_checkpoints.py"
