"""Rule metrics: m_K for the configured K list, readings and norms, from stored statistics."""
from blockcoupling.io import read_netcdf, write_netcdf
from blockcoupling.metrics import MetricConfig, coupling_dataset
from blockcoupling.workflow import run_script


def main(sm):
    spec = sm.params.metrics
    config = MetricConfig(
        ks=tuple(spec["ks"]),
        readings=tuple(spec.get("readings", ("authors", "offdiag"))),
        norms=tuple(spec.get("norms", ("p", "trace"))),
        p=float(spec.get("p", 2)),
    )
    tokens = read_netcdf(sm.input.tokens)
    result = coupling_dataset(read_netcdf(sm.input.depth), tokens if "self_diag" in tokens else None, config)
    write_netcdf(result, sm.output[0])


run_script(snakemake, main)
