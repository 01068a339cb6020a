"""Rules extract / extract_shard / extract_tokens: block Jacobians -> SVDs -> exact coupling
statistics and trajectory metrics, for every prompt or for one shard of them (a token-family
job: the first prompts, writing tokens.nc only)."""

from dataclasses import asdict, replace

from blockcoupling.files.io import provenance, write_netcdf
from blockcoupling.jacobians.extract import MeasureConfig, measure
from blockcoupling.lm import prompts
from blockcoupling.lm.models import load_for_job
from blockcoupling.runtime.runner import run_script


def main(sm):
    config = MeasureConfig.from_config(
        {**sm.params.extract, "chunk_size": sm.resources.vjp_chunk or None}
    )
    items = prompts.read_jsonl(sm.input.prompts)
    whole = str(asdict(config))  # the files' attrs: the options of the whole prompt set
    if sm.params.shard is not None:  # {first, count, token_families}
        first, count = sm.params.shard["first"], sm.params.shard["count"]
        items, config = items[first : first + count], config.for_shard(first)
        if not sm.params.shard["token_families"]:  # a job of their own computes them
            config = replace(config, token_prompts=0)
    model, tokenizer, attrs = load_for_job(
        {**sm.params.model, "load": {**sm.params.model["load"], "device": sm.resources.device}}
    )
    datasets = measure(
        model,
        tokenizer,
        items,
        config,
        attrs=provenance(sm.params.extract, measure_config=whole, **attrs),
    )
    for name in sm.output.keys():  # a token-family job writes tokens.nc only
        write_netcdf(datasets[name], sm.output[name])


run_script(snakemake, main)
