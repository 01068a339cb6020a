"""Rule train_<run>: train (or resume) one GPT-NeoX run, then expose its checkpoints as outputs."""

import shutil
from pathlib import Path

from blockcoupling.train import TrainConfig, train
from blockcoupling.workflow import run_script


def main(sm):
    config = TrainConfig(**sm.params.spec)
    run_dir = Path(sm.output.history).parent
    work = run_dir / "work"  # not an output: survives an interrupted job, so training resumes
    train(config, work, threads=sm.threads)
    for step in config.steps:
        shutil.copytree(
            work / f"step{step}", run_dir / f"step{step}", dirs_exist_ok=True, copy_function=_link
        )
    shutil.copyfile(work / "history.csv", sm.output.history)


def _link(source, target):
    Path(target).unlink(missing_ok=True)
    Path(target).hardlink_to(source)


run_script(snakemake, main)
