"""The work on one model at one step, shared by the per-model rules (extract, evaluate) and
the per-run rules of models trained here (extract_run_<run>): loading it, its Jacobians into the
extraction files, its scores; each writes exactly the files its per-model rule writes (the
measures from those files: ``files.metric_files``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from blockcoupling.coupling.finite import require_finite, scores_defined
from blockcoupling.files.io import provenance, write_netcdf
from blockcoupling.jacobians.extract import ExtractConfig
from blockcoupling.jacobians.extract import extract as extract_statistics
from blockcoupling.lm.evaluate import evaluate
from blockcoupling.lm.models import load_for_job
from blockcoupling.lm.text import prompts


def load(spec: Mapping[str, Any], device: str) -> tuple[Any, Any, dict[str, Any]]:
    """``(model, tokenizer, attrs)`` of a rule's model spec (``model_params``) on ``device``."""
    return load_for_job({**spec, "load": {**spec["load"], "device": device}})


def extract(
    loaded: tuple[Any, Any, dict[str, Any]],
    items: Sequence[prompts.Prompt],
    options: Mapping[str, Any],
    outputs: Mapping[str, str],
    chunk: int | None = None,
    shard: Mapping[str, Any] | None = None,
) -> None:
    """Jacobians -> SVDs -> the coupling statistics of ``items`` (or of one ``shard`` of them:
    ``{first, count, token_families}``), written to ``outputs`` (kind -> path; a token-family
    job names ``tokens`` only).
    """
    model, tokenizer, attrs = loaded
    config = ExtractConfig.from_config({**options, "chunk_size": chunk or None})
    whole = str(asdict(config))  # the files' attrs: the options of the whole prompt set
    if shard is not None:
        first, count = shard["first"], shard["count"]
        items, config = items[first : first + count], config.for_shard(first)
        if not shard["token_families"]:  # a job of their own computes them
            config = replace(config, token_prompts=0)
    datasets = extract_statistics(
        model,
        tokenizer,
        list(items),
        config,
        attrs=provenance(dict(options), extract_config=whole, **attrs),
    )
    for name, path in outputs.items():
        write_netcdf(datasets[name], path)


def scored_items(items: Sequence[prompts.Prompt]) -> list[dict[str, Any]]:
    """The prompts that carry choices and an answer, as ``lm.evaluate`` takes them."""
    return [
        {"text": p.text, "choices": list(p.choices), "answer": int(p.answer)}
        for p in items
        if p.choices and isinstance(p.answer, int)
    ]


def score(
    loaded: tuple[Any, Any, dict[str, Any]],
    items: Sequence[prompts.Prompt],
    heldout: str | Path,
    context_length: int,
    out: str,
    where: str,
) -> None:
    """Bits per byte on the held-out text and multiple-choice accuracy, written to ``out``;
    a non-finite score stops the job naming ``where`` (model and step).
    """
    model, tokenizer, attrs = loaded
    text = Path(heldout).read_text(encoding="utf-8")
    result = evaluate(model, tokenizer, [text], scored_items(items), context_length=context_length)
    require_finite(result, scores_defined(result), where)
    result.attrs.update(provenance({"context_length": context_length}, **attrs))
    write_netcdf(result, out)
