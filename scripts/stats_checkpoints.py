"""Rule stats_checkpoints: coupling, LSS, expodistance and validation loss per checkpoint."""

from pathlib import Path

import pandas as pd

from blockcoupling import stats
from blockcoupling.io import read_netcdf
from blockcoupling.workflow import run_script, selection


def main(sm):
    spec = sm.params.stats
    select = selection(spec)
    histories = []
    for model, run in sm.params.runs.items():
        history = pd.read_csv(f"results/train/{run}/history.csv")
        histories.append(history.assign(model=model))
    history = (
        pd.concat(histories, ignore_index=True)
        if histories
        else pd.DataFrame(columns=["model", "step", "val_loss"])
    )
    table = stats.checkpoint_table(
        read_netcdf(sm.input.coupling), history, read_netcdf(sm.input.trajectories), **select
    )
    frames = {
        "checkpoint_table": table,
        "checkpoint_correlations": stats.checkpoint_correlations(table),
    }
    stats.write_tables(frames, Path(sm.output.table).parent)


run_script(snakemake, main)
