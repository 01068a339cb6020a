"""Rule metrics_<run>: the measures of every model and step of a run trained here, in one
process, into the files of the metrics rule."""

from blockcoupling.files.metric_files import write_metrics
from blockcoupling.runtime.runner import run_script


def main(sm):
    for job in sm.params.jobs:
        write_metrics(
            job["depth"],
            job["tokens"],
            sm.params.metrics,
            job["out"]["depth"],
            job["out"]["tokens"],
            job["where"],
        )


run_script(snakemake, main)
