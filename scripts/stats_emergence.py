"""Rule stats_emergence: the checkpoint table with percentile bootstrap CIs over prompts, and
the emergence design's tests (final vs init, relaxation from the declared peak, locality, the
trend, the two arms over the declared window, LSS and expodistance): the checkpoint outputs
that stats.n_boot changes."""

import pandas as pd

from blockcoupling.files.io import read_netcdf
from blockcoupling.runtime.runner import run_script
from blockcoupling.stats import checkpoints, core, within_arms
from blockcoupling.stats.core import select


def main(sm):
    history = checkpoints.run_histories(
        sm.params.models, dict(zip(sm.params.runs, sm.input.histories))
    )
    coupling = read_netcdf(sm.input.coupling)
    selection, boot = sm.params.selection, sm.params.bootstrap
    table = checkpoints.checkpoint_table(
        coupling, history, read_netcdf(sm.input.trajectories), selection, boot
    )
    emergence = [
        checkpoints.emergence_analyses(
            coupling,
            table,
            selection,
            variable,
            boot,
            primary=tuple(sm.params.primary),
            peak_step=sm.params.peak_step,
        )
        for variable in ("coupling_excess", "coupling")
    ]
    primary = tuple(sm.params.primary)
    emergence.append(
        within_arms.within_arms(coupling, table, sm.params.within_window, primary=primary)
    )
    models = within_arms.suites(coupling)["model"].tolist()
    blocks = (
        checkpoints.init_blocks(select(coupling["coupling_excess"], **selection).sel(model=models))
        if "coupling_excess" in coupling
        else {m: m for m in models}
    )
    emergence.append(within_arms.trajectory_emergence(table, blocks, primary))
    core.write_table(table, sm.output.table)
    core.write_table(pd.concat(emergence, ignore_index=True), sm.output.analyses)


run_script(snakemake, main)
