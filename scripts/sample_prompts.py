"""Rule sample_prompts: a seeded, source-stratified prompt set (local file or the datasets hub)."""

from blockcoupling import prompts
from blockcoupling.workflow import run_script


def main(sm):
    spec, n, seed = sm.params.spec, sm.params.n_per_source, sm.params.seed
    if "file" in spec:
        pool = prompts.load_prompt_file(spec["file"])
    else:
        pool = [p for source in spec["hub"] for p in prompts.load_hub_prompts(source, n, seed)]
    prompts.write_jsonl(prompts.sample_prompts(pool, n, seed), sm.output[0])


run_script(snakemake, main)
