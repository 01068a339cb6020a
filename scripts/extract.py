"""Rules extract / extract_shard / extract_tokens: block Jacobians -> SVDs -> exact coupling
statistics and trajectory metrics, for every prompt or for one shard of them (a token-family
job: the first prompts, writing tokens.nc only)."""

from blockcoupling.lm import model_jobs
from blockcoupling.lm.text import prompts
from blockcoupling.runtime.runner import run_script


def main(sm):
    model_jobs.extract(
        model_jobs.load(sm.params.model, sm.resources.device),
        prompts.read_jsonl(sm.input.prompts),
        sm.params.extract,
        {name: sm.output[name] for name in sm.output.keys()},
        chunk=sm.resources.vjp_chunk,
        shard=sm.params.shard,
    )


run_script(snakemake, main)
