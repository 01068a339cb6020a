"""The work of one model at one step, shared by the per-model rules (extract, metrics,
evaluate) and the per-run rules of models trained here (measure_<run>, metrics_<run>): each
writes exactly the files its per-model rule writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from blockcoupling.coupling.finite import (
    SUMMARIES,
    require_finite,
    require_rank,
    scores_defined,
)
from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset, token_coupling_dataset
from blockcoupling.files.io import provenance, read_netcdf, write_netcdf
from blockcoupling.jacobians.extract import MeasureConfig, measure
from blockcoupling.lm import prompts
from blockcoupling.lm.evaluate import evaluate
from blockcoupling.lm.models import load_for_job


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
    config = MeasureConfig.from_config({**options, "chunk_size": chunk or None})
    whole = str(asdict(config))  # the files' attrs: the options of the whole prompt set
    if shard is not None:
        first, count = shard["first"], shard["count"]
        items, config = items[first : first + count], config.for_shard(first)
        if not shard["token_families"]:  # a job of their own computes them
            config = replace(config, token_prompts=0)
    datasets = measure(
        model,
        tokenizer,
        list(items),
        config,
        attrs=provenance(dict(options), measure_config=whole, **attrs),
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


def metrics(
    depth: str, tokens: str, config: MetricConfig, depth_out: str, tokens_out: str, where: str
) -> None:
    """m_K, the excess and the overlaps for every K of ``config`` from one model's extracted
    files; a rank below the largest K or a non-finite summary stops the job naming ``where``.
    """
    extracted = read_netcdf(depth)
    width = int(extracted.attrs.get("hidden_size", extracted.sizes["rank"]))
    require_rank(extracted["singular_values"], max(config.ks), width, where)
    coupling = coupling_dataset(extracted, config)
    if coupling.sizes["layer"] > 1:  # each is a mean over layer pairs: defined from two layers
        require_finite(coupling, [name for name in SUMMARIES if name in coupling], where)
    write_netcdf(coupling, depth_out)
    write_netcdf(token_coupling_dataset(read_netcdf(tokens), config), tokens_out)
