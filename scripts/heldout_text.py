"""Rule heldout_text: the held-out validation plays (the text every model's bits per byte uses)."""

import os
from pathlib import Path

from blockcoupling.evaluate import heldout_text
from blockcoupling.workflow import run_script


def main(sm):
    target = Path(sm.output[0])
    temp = target.with_suffix(".tmp")
    temp.write_text(heldout_text(sm.params.chars), encoding="utf-8")
    os.replace(temp, target)


run_script(snakemake, main)
