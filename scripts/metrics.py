"""Rule metrics: m_K for the configured K list, readings and norms, from stored statistics."""

from blockcoupling.io import read_netcdf, write_netcdf
from blockcoupling.metrics import MetricConfig, coupling_dataset, token_coupling_dataset
from blockcoupling.runner import run_script


def main(sm):
    config = MetricConfig.from_config(sm.params.metrics)
    write_netcdf(coupling_dataset(read_netcdf(sm.input.depth), config), sm.output.depth)
    write_netcdf(token_coupling_dataset(read_netcdf(sm.input.tokens), config), sm.output.tokens)


run_script(snakemake, main)
