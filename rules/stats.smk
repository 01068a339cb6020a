# statsmodels analyses: coupling vs generalization and hyperparameters (tidy CSV + NetCDF).
STATS = config.get("stats", {})
STATS_TABLES = ("summary", "correlations", "ols", "partial", "k_sweep")


rule stats:
    input:
        coupling="results/combined/coupling.nc",
        evaluation="results/combined/evaluation.nc" if EVALUATE else [],
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
        stats=STATS,
        score=config.get("evaluate", {}).get("score", "score"),
        code=STATS_CODE,
    script:
        "../scripts/stats.py"


rule stats_checkpoints:
    input:
        coupling="results/combined/checkpoints/coupling.nc",
        trajectories="results/combined/checkpoints/trajectories.nc",
        histories=lambda wildcards: [f"results/train/{run}/history.csv" for run in TRAIN_RUNS],
    output:
        table="results/stats/checkpoint_table.csv",
        correlations="results/stats/checkpoint_correlations.csv",
    log:
        "logs/stats/checkpoints.log",
    benchmark:
        "benchmarks/stats/checkpoints.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        stats=STATS,
        runs=lambda wildcards: {
            name: e.source["train"] for name, e in CHECKPOINT_MODELS.items() if "train" in e.source
        },
        code=STATS_CODE,
    script:
        "../scripts/stats_checkpoints.py"
