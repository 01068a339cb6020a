"""Rule stats_checkpoints: coupling (with CIs), LSS, expodistance and validation loss per
checkpoint; their correlations with runs as units; the shape of each emergence curve; the
emergence design's tests."""

import pandas as pd

from blockcoupling.io import read_netcdf
from blockcoupling.runner import run_script
from blockcoupling.stats import checkpoints, core


def main(sm):
    history_of = dict(zip(sm.params.runs, sm.input.histories))
    histories = [
        pd.read_csv(history_of[run]).assign(model=model) for model, run in sm.params.models.items()
    ]
    history = (
        pd.concat(histories, ignore_index=True)
        if histories
        else pd.DataFrame(columns=["model", "step", "val_loss"])
    )
    coupling = read_netcdf(sm.input.coupling)
    boot = dict(n_boot=sm.params.n_boot, seed=sm.params.seed)
    table = checkpoints.checkpoint_table(
        coupling, history, read_netcdf(sm.input.trajectories), **sm.params.selection, **boot
    )
    emergence = [
        checkpoints.emergence_analyses(
            coupling,
            table,
            sm.params.selection,
            variable,
            primary=tuple(sm.params.primary),
            peak_step=sm.params.peak_step,
            **boot,
        )
        for variable in ("coupling_excess", "coupling")
    ]
    core.write_table(table, sm.output.table)
    core.write_table(checkpoints.checkpoint_correlations(table), sm.output.correlations)
    core.write_table(checkpoints.emergence_summary(table), sm.output.emergence)
    core.write_table(pd.concat(emergence, ignore_index=True), sm.output.analyses)


run_script(snakemake, main)
