"""Rule heldout_text: the held-out validation plays (the text every model's bits per byte uses)."""

from blockcoupling.files.io import write_text
from blockcoupling.lm.text.corpus import heldout_text
from blockcoupling.runtime.runner import run_script


def main(sm):
    write_text(sm.output[0], heldout_text(sm.params.chars))


run_script(snakemake, main)
