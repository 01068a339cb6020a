"""Rule stats_checkpoints: coupling, LSS, expodistance and validation loss per checkpoint
(means, no intervals); their correlations with runs as units; the shape of each emergence
curve. No number here depends on stats.n_boot (the intervals and the emergence tests are rule
stats_emergence's)."""

from blockcoupling.files.io import read_netcdf
from blockcoupling.runtime.runner import run_script
from blockcoupling.stats import checkpoints, core
from blockcoupling.stats.selection import POINT


def main(sm):
    history = checkpoints.run_histories(
        sm.params.models, dict(zip(sm.params.runs, sm.input.histories))
    )
    table = checkpoints.checkpoint_table(
        read_netcdf(sm.input.coupling),
        history,
        read_netcdf(sm.input.trajectories),
        sm.params.selection,
        POINT,  # the means only
    )
    table = core.without_intervals(table)
    core.write_table(table, sm.output.points)
    core.write_table(checkpoints.checkpoint_correlations(table), sm.output.correlations)
    core.write_table(checkpoints.emergence_summary(table), sm.output.emergence)


run_script(snakemake, main)
