"""Rule vit_combine: m_K of every grid point and its test accuracy -> results/vit/combined.nc."""

import pandas as pd

from blockcoupling.files.io import provenance, read_netcdf, write_netcdf
from blockcoupling.runtime.runner import run_script
from blockcoupling.vit.results import grid_dataset


def main(sm):
    parts = {
        tuple(point): (read_netcdf(depth), read_netcdf(tokens), pd.read_csv(history))
        for point, depth, tokens, history in zip(
            sm.params.points, sm.input.depth, sm.input.tokens, sm.input.histories
        )
    }
    metric = sm.params.metrics  # the checked MetricConfig at the sweep's Ks
    dataset = grid_dataset(parts, metric, provenance(metric._asdict()))
    write_netcdf(dataset, sm.output[0])


run_script(snakemake, main)
