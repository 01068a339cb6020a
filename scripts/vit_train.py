"""Rule vit_train: train (or resume) one ViT of the sweep; publish copies of its weights and
history (not hard links: damage to one would be damage to both).
"""

import shutil
from pathlib import Path

from blockcoupling.runtime.device import resolve_device
from blockcoupling.runtime.runner import math_threads, run_script
from blockcoupling.vit.config import ViTRunConfig
from blockcoupling.vit.data import read_prepared
from blockcoupling.vit.train import train_vit, work_dir


def main(sm):
    config = ViTRunConfig(**sm.params.run)
    work = work_dir(Path(sm.output.model).parent, config, sm.params.code)
    device = resolve_device(sm.resources.device)
    weights = train_vit(config, read_prepared(sm.input.data), work, math_threads(sm), device)
    for source, target in ((weights, sm.output.model), (work / "history.csv", sm.output.history)):
        Path(target).unlink(missing_ok=True)  # never written through an old hard link
        shutil.copyfile(source, target)


run_script(snakemake, main)
