"""Rules combine_models / combine_checkpoints: one dataset across models (and init or step)."""

from blockcoupling.combine import combine
from blockcoupling.io import read_netcdf, write_netcdf
from blockcoupling.workflow import run_script


def main(sm):
    parts = {tuple(key): read_netcdf(path) for key, path in zip(sm.params.parts, sm.input)}
    write_netcdf(combine(parts, sm.wildcards.name, sm.params.along, sm.params.meta), sm.output[0])


run_script(snakemake, main)
