"""Rule vit_combine: m_K of every grid point and its test accuracy -> results/vit/combined.nc."""

from blockcoupling.files.io import provenance, write_netcdf
from blockcoupling.runtime.runner import run_script
from blockcoupling.vit.results import grid_dataset, read_part


def main(sm):
    parts = dict(read_part(part) for part in sm.params.parts)  # files named with their point
    metric = sm.params.metrics  # the checked MetricConfig at the sweep's Ks
    dataset = grid_dataset(parts, metric, provenance(metric._asdict()))
    write_netcdf(dataset, sm.output[0])


run_script(snakemake, main)
