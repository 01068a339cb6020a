"""Rule metrics: m_K for the configured K list, readings and norms, from stored statistics."""

from blockcoupling.runtime import model_jobs
from blockcoupling.runtime.runner import run_script


def main(sm):
    model_jobs.metrics(
        sm.input.depth,
        sm.input.tokens,
        sm.params.metrics,  # the checked MetricConfig
        sm.output.depth,
        sm.output.tokens,
        where=f"model {sm.wildcards.model}, step {sm.wildcards.step}",
    )


run_script(snakemake, main)
