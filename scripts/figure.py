"""Rules figure_<name>: one figure (PNG + PDF) from a combined dataset or a stats table."""

import os

from blockcoupling import figures
from blockcoupling.pipeline.figure_stamp import CONFIG_HASH_ENV, stamp_png
from blockcoupling.runtime.runner import run_script


def main(sm):
    figures.render(
        sm.params.figure,
        sm.input.source,
        sm.output.png,
        tables=list(sm.input.tables),
        **sm.params.options,
    )
    # commit, the config's hash (the Snakefile's, of the config as read) and the code's
    stamp_png(sm.output.png, os.environ[CONFIG_HASH_ENV], sm.params.code)


run_script(snakemake, main)
