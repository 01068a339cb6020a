"""Rules metrics and metrics_<run>: m_K for the configured K list, readings and norms, from the
stored statistics of each (model, step) of ``params.jobs``, in one process."""

from blockcoupling.files.metric_files import write_metrics
from blockcoupling.runtime.runner import run_script


def main(sm):
    for job in sm.params.jobs:
        write_metrics(
            job["depth"],
            job["tokens"],
            sm.params.metrics,  # the checked MetricConfig (the Plan's)
            job["out"]["depth"],
            job["out"]["tokens"],
            job["where"],
        )


run_script(snakemake, main)
