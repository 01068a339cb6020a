# One rule per figure of blockcoupling.figures.FIGURES whose input the config produces; each PNG
# is registered in the HTML report with its caption (report/<figure>.rst). A figure also reads
# the statistics tables its titles quote (FIGURES' fourth field) where the config produces them.
# A figure's params are only the options it takes, so no config key re-runs a figure by itself;
# it re-runs when a file it reads is rewritten. stats.n_boot changes only the bootstrap jobs'
# outputs (stats_summary: summary.csv; stats_emergence: checkpoint_table.csv, emergence.csv), so
# it re-runs coupling_vs_score, coupling_vs_step and the two ViT figures, which draw those
# intervals, and no other figure.
FIGURE_TARGETS = []
for _figure, (_category, _source, _takes, _tables) in FIGURES.items():
    if _source not in PLAN.targets():
        continue
    FIGURE_TARGETS.append(f"results/figures/{_figure}.png")

    rule:
        f"""{figure_doc(_figure)}"""
        name:
            f"figure_{_figure}"
        input:
            source=_source,
            tables=[table for table in _tables if table in PLAN.targets()],
        output:
            png=report(
                f"results/figures/{_figure}.png",
                caption=f"../report/{_figure}.rst",
                category=_category,
            ),
            pdf=f"results/figures/{_figure}.pdf",
        log:
            f"logs/figures/{_figure}.log",
        benchmark:
            f"benchmarks/figures/{_figure}.tsv"
        group:
            job_group(f"figure_{_figure}")
        conda:
            "../envs/analysis.yaml"
        resources:
            **JOBS.own(),
        params:
            figure=_figure,
            options={
                "selection": PLAN.selection if "selection" in _takes else None,
                "token_model": PLAN.token_model if "token_model" in _takes else None,
            },
            code=script_hash("figure"),
        script:
            "../scripts/figure.py"
