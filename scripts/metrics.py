"""Rule metrics: m_K for the configured K list, readings and norms, from stored statistics."""

from blockcoupling.io import read_netcdf, write_netcdf
from blockcoupling.metrics import MetricConfig, coupling_dataset, token_coupling_dataset
from blockcoupling.workflow import run_script


def main(sm):
    spec = sm.params.metrics
    config = MetricConfig(
        ks=tuple(spec["ks"]),
        readings=tuple(spec.get("readings", ("authors", "offdiag"))),
        norms=tuple(spec.get("norms", ("p", "trace"))),
        p=float(spec.get("p", 2)),
    )
    write_netcdf(coupling_dataset(read_netcdf(sm.input.depth), config), sm.output.depth)
    write_netcdf(token_coupling_dataset(read_netcdf(sm.input.tokens), config), sm.output.tokens)


run_script(snakemake, main)
