"""Rule evaluate: bits per byte on held-out text and multiple-choice accuracy on the prompts."""

from blockcoupling.lm import model_jobs
from blockcoupling.lm.text import prompts
from blockcoupling.runtime.runner import run_script


def main(sm):
    model_jobs.score(
        model_jobs.load(sm.params.model, sm.resources.device),
        prompts.read_jsonl(sm.input.prompts),
        sm.input.heldout,
        sm.params.context_length,
        sm.output[0],
        where=f"model {sm.wildcards.model}, step {sm.wildcards.step}",
    )


run_script(snakemake, main)
