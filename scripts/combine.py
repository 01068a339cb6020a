"""Rules combine_models / combine_checkpoints: one dataset across models (and init or step)."""

from pathlib import Path

from blockcoupling.coupling.finite import CHANGED, require_finite, statistic_inputs
from blockcoupling.files.combine import combine
from blockcoupling.files.io import read_netcdf, write_netcdf
from blockcoupling.runtime.runner import run_script


def main(sm):
    # (model, step, file): a shared random-init twin's file stands for several models
    files = {path: read_netcdf(path) for path in sm.input}
    parts = {(model, step): files[path] for model, step, path in sm.params.parts}
    name = Path(sm.output[0]).stem
    for model, step, path in sm.params.parts:  # no statistic over a silently smaller set
        dataset = files[path]
        require_finite(
            dataset, statistic_inputs(dataset, name), f"{path} ({model}, {step})", CHANGED
        )
    write_netcdf(combine(parts, name, sm.params.along, sm.params.meta), sm.output[0])


run_script(snakemake, main)
