"""Rule evaluate: bits per byte on held-out text and multiple-choice accuracy on the prompts."""

from pathlib import Path

from blockcoupling.coupling.finite import require_finite, scores_defined
from blockcoupling.files.io import provenance, write_netcdf
from blockcoupling.lm import prompts
from blockcoupling.lm.evaluate import evaluate
from blockcoupling.lm.models import load_for_job
from blockcoupling.runtime.runner import run_script


def main(sm):
    model, tokenizer, attrs = load_for_job(
        {**sm.params.model, "load": {**sm.params.model["load"], "device": sm.resources.device}}
    )
    items = [
        {"text": p.text, "choices": list(p.choices), "answer": int(p.answer)}
        for p in prompts.read_jsonl(sm.input.prompts)
        if p.choices and isinstance(p.answer, int)
    ]
    text = Path(sm.input.heldout).read_text(encoding="utf-8")
    result = evaluate(model, tokenizer, [text], items, context_length=sm.params.context_length)
    where = f"model {sm.wildcards.model}, step {sm.wildcards.step}"
    require_finite(result, scores_defined(result), where)
    result.attrs.update(provenance({"context_length": sm.params.context_length}, **attrs))
    write_netcdf(result, sm.output[0])


run_script(snakemake, main)
