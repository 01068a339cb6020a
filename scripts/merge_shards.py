"""Rule merge_shards: one model's prompt shards merged into the files one job would write."""

from blockcoupling.files.io import read_netcdf, write_netcdf
from blockcoupling.jacobians.datasets import merge_shards
from blockcoupling.runtime.runner import run_script


def main(sm):
    for kind, paths in sm.params.parts.items():
        write_netcdf(merge_shards([read_netcdf(path) for path in paths]), sm.output[kind])


run_script(snakemake, main)
