"""Rule metrics: m_K for the configured K list, readings and norms, from stored statistics."""

from blockcoupling.coupling.finite import SUMMARIES, require_finite, require_rank
from blockcoupling.coupling.metrics import coupling_dataset, token_coupling_dataset
from blockcoupling.files.io import read_netcdf, write_netcdf
from blockcoupling.runtime.runner import run_script


def main(sm):
    config = sm.params.metrics  # the checked MetricConfig
    where = f"model {sm.wildcards.model}, step {sm.wildcards.step}"
    extracted = read_netcdf(sm.input.depth)
    width = int(extracted.attrs.get("hidden_size", extracted.sizes["rank"]))
    require_rank(extracted["singular_values"], max(config.ks), width, where)
    depth = coupling_dataset(extracted, config)
    if depth.sizes["layer"] > 1:  # each is a mean over layer pairs: defined from two layers
        names = [name for name in SUMMARIES if name in depth]
        require_finite(depth, names, where)
    write_netcdf(depth, sm.output.depth)
    write_netcdf(token_coupling_dataset(read_netcdf(sm.input.tokens), config), sm.output.tokens)


run_script(snakemake, main)
