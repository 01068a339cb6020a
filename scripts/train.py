"""Rule train_<run>: train (or resume) one GPT-NeoX run, then expose its checkpoints as outputs."""

import shutil
from pathlib import Path

from blockcoupling.runner import run_script
from blockcoupling.train import TrainConfig, train, work_dir


def main(sm):
    config = TrainConfig(**sm.params.spec)
    work = work_dir(Path(sm.output.history).parent, config, sm.params.code)
    train(config, work, threads=sm.threads)
    for step, checkpoint in zip(config.steps, sm.output.checkpoints):
        shutil.copytree(
            work / f"step{step}", Path(checkpoint).parent, dirs_exist_ok=True, copy_function=_link
        )
    shutil.copyfile(work / "history.csv", sm.output.history)


def _link(source, target):
    Path(target).unlink(missing_ok=True)
    Path(target).hardlink_to(source)


run_script(snakemake, main)
