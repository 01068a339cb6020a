"""Rule merge_shards: one model's prompt shards merged into the files one job would write."""

from blockcoupling.io import read_netcdf, write_netcdf
from blockcoupling.measure_datasets import merge_shards
from blockcoupling.runner import run_script


def main(sm):
    kinds = sm.params.kinds
    for i, kind in enumerate(kinds):
        shards = [read_netcdf(path) for path in sm.input[i :: len(kinds)]]
        write_netcdf(merge_shards(shards), sm.output[kind])


run_script(snakemake, main)
