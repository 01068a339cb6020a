"""Generalization measures of any HF causal LM: bits per byte on held-out text, multiple-choice
accuracy.

Every sequence is scored after a prefix token (the tokenizer's BOS, else its EOS, as in
lm-evaluation-harness), so the first token of a text is scored too, and texts are tokenized
without special tokens, so a tokenizer that adds BOS itself gives the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch
import xarray as xr

from blockcoupling.runtime.progress import track

Normalize = Literal["none", "bytes"]


def _prefix_id(tokenizer) -> int:
    for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    raise ValueError(
        "the tokenizer has neither a bos nor an eos token to condition the first token on"
    )


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _context_length(model, context_length: int | None) -> int:
    length = context_length or getattr(model.config, "max_position_embeddings", None)
    if not length or length < 1:
        raise ValueError("give context_length: the model config has no max_position_embeddings")
    return int(length)


@contextmanager
def _eval_mode(model) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def target_logprobs(
    model, windows: Sequence[tuple[list[int], int]], batch_size: int = 4, progress: bool = False
) -> list[np.ndarray]:
    """Log-probabilities (nats, float64) of the last ``n`` tokens of each ``(tokens, n)`` window,
    each conditioned on all earlier tokens of its window; the model sees ``tokens[:-1]``
    (right-padded in batches, masked), so ``len(tokens) - 1`` must fit its context.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    order = sorted(
        (i for i, (_, n) in enumerate(windows) if n > 0), key=lambda i: -len(windows[i][0])
    )
    out: list[np.ndarray] = [np.zeros(0)] * len(windows)
    starts = range(0, len(order), batch_size)
    with _eval_mode(model):
        for start in track(
            starts, len(starts), "score", lambda s: f"batch {s // batch_size}", progress
        ):
            idx = order[start : start + batch_size]
            width = max(len(windows[i][0]) for i in idx) - 1
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            mask = torch.zeros(len(idx), width, dtype=torch.long)
            for row, i in enumerate(idx):
                tokens = windows[i][0]
                ids[row, : len(tokens) - 1] = torch.tensor(tokens[:-1])
                mask[row, : len(tokens) - 1] = 1
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            for row, i in enumerate(idx):
                tokens, n = windows[i]
                logp = torch.log_softmax(
                    logits[row, len(tokens) - 1 - n : len(tokens) - 1].float(), dim=-1
                )
                tgt = torch.tensor(tokens[-n:], device=device)
                out[i] = logp.gather(1, tgt[:, None])[:, 0].double().cpu().numpy()
    return out


def _sliding_windows(
    ids: list[int], prefix: int, context_length: int, stride: int
) -> list[tuple[list[int], int]]:
    """Windows scoring every token of ``ids`` once: targets in chunks of ``stride``, each chunk
    with as much preceding context as fits in ``context_length`` input tokens.
    """
    seq = [prefix, *ids]
    windows = []
    for a in range(1, len(seq), stride):
        b = min(a + stride, len(seq))
        lo = max(0, b - 1 - context_length)
        windows.append((seq[lo:b], b - a))
    return windows


def nll_bits_and_bytes(
    model,
    tokenizer,
    texts: Sequence[str],
    context_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 4,
    progress: bool = False,
) -> tuple[float, int]:
    """(summed next-token NLL in bits, summed UTF-8 bytes) over ``texts``; see
    :func:`bits_per_byte`.
    """
    length = _context_length(model, context_length)
    stride = stride or length
    if not 1 <= stride <= length:
        raise ValueError(f"stride must be in [1, context_length={length}], got {stride}")
    prefix = _prefix_id(tokenizer)
    windows = [
        w
        for text in texts
        if text
        for w in _sliding_windows(_encode(tokenizer, text), prefix, length, stride)
    ]
    n_bytes = sum(len(text.encode("utf-8")) for text in texts)
    if n_bytes == 0:
        raise ValueError("no text to score: texts are empty")
    nats = -sum(float(lp.sum()) for lp in target_logprobs(model, windows, batch_size, progress))
    return nats / math.log(2), n_bytes


def bits_per_byte(
    model,
    tokenizer,
    texts: Sequence[str],
    context_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 4,
    progress: bool = False,
) -> float:
    """Next-token NLL in bits over all tokens of ``texts`` divided by their UTF-8 byte count.

    Long texts are scored with sliding windows of ``context_length`` input tokens (default: the
    model's max_position_embeddings): targets in chunks of ``stride`` tokens (default: the context
    length), so every token has at least ``context_length - stride`` tokens of context and is
    scored once. Log-softmax in float32, sums in float64.
    """
    bits, n_bytes = nll_bits_and_bytes(
        model, tokenizer, texts, context_length, stride, batch_size, progress
    )
    return bits / n_bytes


def _choice_windows(
    tokenizer, text: str, choice: str, prefix: int, context_length: int
) -> tuple[list[int], int]:
    """(tokens, n continuation tokens): trailing spaces of the text move into the choice and the
    continuation is the tail of tokenize(text + choice), as in lm-evaluation-harness.
    """
    n_space = len(text) - len(text.rstrip())
    if n_space:
        text, choice = text[:-n_space], text[-n_space:] + choice
    context = _encode(tokenizer, text)
    whole = _encode(tokenizer, text + choice)
    cont = whole[len(context) :] if whole[: len(context)] == context else _encode(tokenizer, choice)
    if len(cont) > context_length:
        raise ValueError(
            f"a choice of {len(cont)} tokens does not fit the context of {context_length}"
        )
    tokens = [prefix, *context, *cont][-(context_length + 1) :]
    return tokens, len(cont)


def choice_loglikelihoods(
    model,
    tokenizer,
    items: Sequence[dict],
    context_length: int | None = None,
    batch_size: int = 4,
    progress: bool = False,
) -> list[np.ndarray]:
    """Per item with choices: the summed log-likelihood (nats) of each choice given ``text``
    (left-truncated to the context), shape (n_choices,). Items without choices are skipped.
    """
    length = _context_length(model, context_length)
    prefix = _prefix_id(tokenizer)
    scored = [item for item in items if item.get("choices")]
    windows, owners = [], []
    for k, item in enumerate(scored):
        if not 0 <= int(item["answer"]) < len(item["choices"]):
            raise ValueError(
                f"answer {item['answer']} is not an index into {len(item['choices'])} choices"
            )
        for choice in item["choices"]:
            windows.append(_choice_windows(tokenizer, item["text"], choice, prefix, length))
            owners.append(k)
    logps = target_logprobs(model, windows, batch_size, progress)
    out: list[list[float]] = [[] for _ in scored]
    for k, lp in zip(owners, logps):
        out[k].append(float(lp.sum()))
    return [np.asarray(v) for v in out]


def _accuracy(items: Sequence[dict], loglik: list[np.ndarray], normalize: Normalize) -> float:
    """Fraction right; NaN without choices, or when a log-likelihood is not finite (argmax
    would silently pick the first NaN).
    """
    scored = [item for item in items if item.get("choices")]
    if not scored or not all(np.isfinite(ll).all() for ll in loglik):
        return math.nan
    hits = []
    for item, ll in zip(scored, loglik):
        if normalize == "bytes":
            ll = ll / np.maximum([len(c.encode("utf-8")) for c in item["choices"]], 1)
        hits.append(int(np.argmax(ll)) == int(item["answer"]))
    return float(np.mean(hits))


def multiple_choice_accuracy(
    model,
    tokenizer,
    items: Sequence[dict],
    normalize: Normalize = "none",
    context_length: int | None = None,
    batch_size: int = 4,
    progress: bool = False,
) -> float:
    """Fraction of items (dicts with ``text``, ``choices``, ``answer`` index) whose answer has the
    highest log-likelihood given the text. Default ``normalize="none"``: summed log-likelihood
    (lm-eval ``acc``); ``"bytes"``: divided by the choice's UTF-8 bytes (like ``acc_norm``).
    NaN when no item has choices; ties go to the first choice.
    """
    if normalize not in ("none", "bytes"):
        raise ValueError(f"normalize must be 'none' or 'bytes', got {normalize!r}")
    loglik = choice_loglikelihoods(model, tokenizer, items, context_length, batch_size, progress)
    return _accuracy(items, loglik, normalize)


def evaluate(
    model,
    tokenizer,
    texts: Sequence[str],
    items: Sequence[dict],
    context_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 4,
    progress: bool = True,
) -> xr.Dataset:
    """Scalars ``bits_per_byte`` (of ``texts``), ``mc_accuracy`` (summed log-likelihood, NaN without
    choices) and ``mc_accuracy_norm`` (byte-normalised); attrs ``n_bytes``, ``n_items`` (with
    choices), ``n_choices``, ``context_length``, ``stride``. A model whose outputs are not finite
    gives NaN scores: ``finite.scores_defined`` lists those that must be finite.
    """
    length = _context_length(model, context_length)
    bits, n_bytes = nll_bits_and_bytes(
        model, tokenizer, texts, length, stride, batch_size, progress
    )
    loglik = choice_loglikelihoods(model, tokenizer, items, length, batch_size, progress)
    return xr.Dataset(
        {
            "bits_per_byte": bits / n_bytes,
            "mc_accuracy": _accuracy(items, loglik, "none"),
            "mc_accuracy_norm": _accuracy(items, loglik, "bytes"),
        },
        attrs={
            "n_bytes": n_bytes,
            "n_items": len(loglik),
            "n_choices": int(sum(len(ll) for ll in loglik)),
            "context_length": length,
            "stride": stride or length,
        },
    )
