"""Rule sample_prompts: a seeded, source-stratified prompt set (local file or hub datasets, read
offline from their folders in the hub cache), plus held-out Shakespeare passages when the set
asks; beside it the set's provenance (the dataset commits fetched, or the file's SHA-256)."""

import json

from blockcoupling.files.io import write_text
from blockcoupling.lm.text import prompts
from blockcoupling.runtime.runner import run_script


def main(sm):
    n, seed = sm.params.n_per_source, sm.params.seed
    if sm.params.hub:
        pool = [
            p
            for source, folder in zip(sm.params.hub, sm.input.datasets, strict=True)
            for p in prompts.load_hub_prompts(source, n, seed, folder)
        ]
    else:
        pool = prompts.load_prompt_file(sm.input.file)
    chosen = prompts.sample_prompts(pool, n, seed)
    if sm.params.shakespeare:
        heldout = dict(sm.params.shakespeare)
        passages = prompts.heldout_prompts(heldout["skip_chars"], heldout["chars"])
        chosen = prompts.merge_sources(chosen, prompts.sample_prompts(passages, heldout["n"], seed))
    prompts.write_jsonl(chosen, sm.output.prompts)
    manifests = dict(zip(sm.params.hub, sm.input.manifests, strict=True))
    found = prompts.provenance(manifests, None if sm.params.hub else sm.input.file)
    found.update(seed=seed, n_per_source=n, shakespeare=sm.params.shakespeare)
    write_text(sm.output.provenance, json.dumps(found, indent=1, sort_keys=True) + "\n")


run_script(snakemake, main)
