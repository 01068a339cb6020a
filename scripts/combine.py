"""Rules combine_models / combine_checkpoints: one dataset across models (and init or step)."""

from pathlib import Path

from blockcoupling.combine import combine
from blockcoupling.io import read_netcdf, write_netcdf
from blockcoupling.runner import run_script


def main(sm):
    parts = {tuple(key): read_netcdf(path) for key, path in zip(sm.params.parts, sm.input)}
    name = Path(sm.output[0]).stem
    write_netcdf(combine(parts, name, sm.params.along, sm.params.meta), sm.output[0])


run_script(snakemake, main)
