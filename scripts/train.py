"""Rule train_<run>: train (or resume) one GPT-NeoX run, then publish its checkpoints as outputs.

The published checkpoints are copies of the work folder's, not hard links: a link would share
damage (a truncated file in one is truncated in the other) and the work folder's checksums
could no longer tell which to trust. Each copy is recorded in the results manifest.
"""

import shutil
from pathlib import Path

from blockcoupling.files import manifest
from blockcoupling.lm.training.train import TrainConfig, train, work_dir
from blockcoupling.runtime.runner import math_threads, run_script


def main(sm):
    config = TrainConfig(**sm.params.spec)
    work = work_dir(Path(sm.output.history).parent, config, sm.params.code)
    train(config, work, threads=math_threads(sm))
    for step, checkpoint in zip(config.steps, sm.output.checkpoints):
        published = Path(checkpoint).parent
        shutil.copytree(work / f"step{step}", published, dirs_exist_ok=True, copy_function=_copy)
        manifest.record((p for p in published.rglob("*") if p.is_file()), sm.rule)
    shutil.copyfile(work / "history.csv", sm.output.history)


def _copy(source, target):
    """A fresh copy (the umask's permissions; never written through an old hard link)."""
    Path(target).unlink(missing_ok=True)
    shutil.copyfile(source, target)


run_script(snakemake, main)
