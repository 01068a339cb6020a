"""Rule metrics: m_K for the configured K list, readings and norms, from stored statistics."""

from blockcoupling.files.metric_files import write_metrics
from blockcoupling.runtime.runner import run_script


def main(sm):
    write_metrics(
        sm.input.depth,
        sm.input.tokens,
        sm.params.metrics,  # the checked MetricConfig
        sm.output.depth,
        sm.output.tokens,
        where=f"model {sm.wildcards.model}, step {sm.wildcards.step}",
    )


run_script(snakemake, main)
