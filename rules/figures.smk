# One rule per figure of blockcoupling.figures.FIGURES whose input the config produces; each PNG
# is registered in the HTML report with its caption (report/<figure>.rst). A figure's params are
# only the options it takes, so e.g. stats.n_boot re-runs no figure.
FIGURE_TARGETS = []
for _figure, (_category, _source, _takes) in figure_registry().items():
    if _source not in PLAN.targets():
        continue
    FIGURE_TARGETS.append(f"results/figures/{_figure}.png")

    rule:
        name:
            f"figure_{_figure}"
        input:
            _source,
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
        conda:
            "../envs/analysis.yaml"
        params:
            figure=_figure,
            options={
                "selection": PLAN.selection if "selection" in _takes else None,
                "token_model": PLAN.token_model if "token_model" in _takes else None,
            },
            code=script_hash("figure"),
        script:
            "../scripts/figure.py"
