"""Rules figure_<name>: one figure (PNG + PDF) from a combined dataset or a stats table."""

from blockcoupling import figures
from blockcoupling.runtime.runner import run_script


def main(sm):
    figures.render(
        sm.params.figure,
        sm.input.source,
        sm.output.png,
        tables=list(sm.input.tables),
        **sm.params.options,
    )


run_script(snakemake, main)
