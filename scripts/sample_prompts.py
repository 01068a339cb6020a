"""Rule sample_prompts: a seeded, source-stratified prompt set (local file or the datasets hub,
plus held-out Shakespeare passages when the set asks)."""

from blockcoupling import prompts
from blockcoupling.runner import run_script


def main(sm):
    n, seed = sm.params.n_per_source, sm.params.seed
    if sm.input:
        pool = prompts.load_prompt_file(sm.input[0])
    else:
        pool = [p for source in sm.params.hub for p in prompts.load_hub_prompts(source, n, seed)]
    chosen = prompts.sample_prompts(pool, n, seed)
    if sm.params.shakespeare:
        heldout = dict(sm.params.shakespeare)
        passages = prompts.heldout_prompts(heldout["skip_chars"], heldout["chars"])
        chosen = prompts.merge_sources(chosen, prompts.sample_prompts(passages, heldout["n"], seed))
    prompts.write_jsonl(chosen, sm.output[0])


run_script(snakemake, main)
