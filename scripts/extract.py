"""Rule extract / extract_shard: block Jacobians -> SVDs -> exact coupling statistics and
trajectory metrics, for every prompt or for one shard ``(first, count)`` of them."""

from blockcoupling import prompts
from blockcoupling.io import provenance, write_netcdf
from blockcoupling.measure import MeasureConfig, measure
from blockcoupling.models import load_for_job
from blockcoupling.runner import run_script


def main(sm):
    config = MeasureConfig.from_config(
        {**sm.params.extract, "chunk_size": sm.resources.vjp_chunk or None}
    )
    items = prompts.read_jsonl(sm.input.prompts)
    if sm.params.shard is not None:
        first, count = sm.params.shard
        items, config = items[first : first + count], config.for_shard(first)
    model, tokenizer, attrs = load_for_job(
        {**sm.params.model, "load": {**sm.params.model["load"], "device": sm.resources.device}}
    )
    datasets = measure(
        model, tokenizer, items, config, attrs=provenance(sm.params.extract, **attrs)
    )
    for name, dataset in datasets.items():
        write_netcdf(dataset, sm.output[name])


run_script(snakemake, main)
