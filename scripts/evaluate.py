"""Rule evaluate: bits per byte on held-out text and multiple-choice accuracy on the prompts."""

from pathlib import Path

from blockcoupling import prompts
from blockcoupling.evaluate import evaluate
from blockcoupling.io import provenance, write_netcdf
from blockcoupling.workflow import load_for_rule, run_script


def main(sm):
    spec = sm.params.evaluate
    model, tokenizer, attrs = load_for_rule(sm.params.model)
    items = [
        {"text": p.text, "choices": list(p.choices), "answer": int(p.answer)}
        for p in prompts.read_jsonl(sm.input.prompts)
        if p.choices and isinstance(p.answer, int)
    ]
    text = Path(sm.input.heldout).read_text(encoding="utf-8")
    result = evaluate(model, tokenizer, [text], items, context_length=spec.get("context_length"))
    result.attrs.update(provenance(spec, **attrs))
    write_netcdf(result, sm.output[0])


run_script(snakemake, main)
