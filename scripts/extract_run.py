"""Rule extract_run_<run>: every model and step of a run trained here, extracted (and its final
models scored) in one process, into the files of the extract and evaluate rules."""

import logging

from blockcoupling.lm import model_jobs
from blockcoupling.lm.text import prompts
from blockcoupling.runtime.runner import run_script


def main(sm):
    items = prompts.read_jsonl(sm.input.prompts)
    for number, job in enumerate(sm.params.jobs, start=1):
        logging.info("%s (%d of %d)", job["where"], number, len(sm.params.jobs))
        loaded = model_jobs.load(job["model"], sm.resources.device)
        model_jobs.extract(
            loaded, items, job["extract"], job["extracted"], chunk=sm.resources.vjp_chunk
        )
        if job["evaluation"]:
            model_jobs.score(
                loaded,
                items,
                sm.input.heldout[0],
                sm.params.context_length,
                job["evaluation"],
                job["where"],
            )


run_script(snakemake, main)
