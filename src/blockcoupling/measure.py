"""The one-call API: ``measure(model, tokenizer, prompts)`` -> xarray datasets (docs/datasets.md).

Shared by the workflow's rules and by notebooks. Per prompt: one recorded forward pass, the
depth-wise Jacobians ``J^l_{tt}`` at the depth token for every block, optionally every
``J^l_{t1 t2}`` at the token layers, their SVDs, the exact coupling statistics of every pair, and
the trajectory metrics of every token. ``measure_inputs`` is the same for any model inputs (image
models); ``metrics.coupling_dataset`` then turns statistics into m_K.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import nn

from blockcoupling.capture import states
from blockcoupling.coupling import bases, cross_stats
from blockcoupling.jacobians import JacobianEngine
from blockcoupling.measure_datasets import (
    DepthResult,
    TokenResult,
    depth_dataset,
    spectra_dataset,
    tokens_dataset,
    trajectory_dataset,
)
from blockcoupling.models import blocks_of
from blockcoupling.options import MeasureConfig, PromptText
from blockcoupling.progress import track
from blockcoupling.spectral import svd

__all__ = ["MeasureConfig", "PromptText", "as_prompts", "measure", "measure_inputs"]


def _field(prompt: Any, key: str, default: Any) -> Any:
    """A prompt's field, from a mapping or an attribute."""
    if isinstance(prompt, Mapping):
        return prompt.get(key, default)
    return getattr(prompt, key, default)


def as_prompts(prompts: Sequence[Any]) -> list[PromptText]:
    """Accept strings, mappings with ``text`` (and optional ``id``, ``source``), or objects with
    ``id``, ``source``, ``text`` attributes (e.g. ``prompts.Prompt``).
    """
    result = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            result.append(PromptText(f"p{i:04d}", "text", prompt))
            continue
        text = _field(prompt, "text", None)
        if not isinstance(text, str):
            raise ValueError(
                f"prompt {i}: needs a text (a string, or a mapping/object with 'text')"
            )
        pid, source = _field(prompt, "id", f"p{i:04d}"), _field(prompt, "source", "text")
        result.append(PromptText(str(pid), str(source), text))
    if not result:
        raise ValueError("no prompts given")
    ids = [p.id for p in result]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids are not unique")
    return result


def context_length(model: nn.Module) -> int | None:
    """The model's maximum number of positions, if its config says."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def tokenize(
    tokenizer: Any, prompt: PromptText, max_tokens: int | None, limit: int | None
) -> torch.Tensor:
    """Token ids ``(1, token)`` of one prompt (special tokens as the model adds them)."""
    if not prompt.text.strip():
        raise ValueError(f"prompt {prompt.id!r} is empty")
    ids = tokenizer(prompt.text, return_tensors="pt")["input_ids"]
    if max_tokens is not None:
        ids = ids[:, :max_tokens]
    if ids.shape[1] < 2:
        raise ValueError(f"prompt {prompt.id!r} has {ids.shape[1]} token(s); at least 2 are needed")
    if limit is not None and ids.shape[1] > limit:
        raise ValueError(
            f"prompt {prompt.id!r} has {ids.shape[1]} tokens, longer than the model's context of {limit}; "
            "set max_tokens"
        )
    return ids


@contextlib.contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Run with eager attention (sdpa has no forward AD and a slow vmap backward on CPU), and
    record masks under it (eager without a mask is not causal). Restores the previous setting.
    """
    previous = getattr(model.config, "_attn_implementation", None)
    switch = previous not in (None, "eager") and hasattr(model, "set_attn_implementation")
    if switch:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if switch:
            model.set_attn_implementation(previous)


def _resolve_position(position: int, n: int, what: str) -> int:
    resolved = position + n if position < 0 else position
    if not 0 <= resolved < n:
        raise ValueError(f"{what} {position} is outside the prompt's {n} tokens")
    return resolved


def _resolve_layers(layers: Sequence[int], n_layers: int) -> list[int]:
    resolved = []
    for layer in layers:
        value = layer + n_layers + 1 if layer < 0 else layer
        if not 1 <= value <= n_layers:
            raise ValueError(f"token layer {layer} is outside 1..{n_layers} (or -{n_layers}..-1)")
        resolved.append(value)
    return sorted(set(resolved))


def _depth(engine: JacobianEngine, t: int, config: MeasureConfig, n_layers: int) -> DepthResult:
    jacs = []
    for layer in range(1, n_layers + 1):
        jacs.append(engine.diagonal(layer, t))
    jac = torch.stack(jacs)
    factors = svd(jac)
    top = factors.top(config.k_max)
    stats = [cross_stats(jac, *bases(top, variant)) for variant in config.variants]
    result = DepthResult(
        factors.s.double().cpu().numpy(),
        np.stack([d.cpu().numpy() for d, _ in stats]),
        np.stack([c.cpu().numpy() for _, c in stats]),
    )
    if config.store_factors:
        result.u, result.v = top.u.cpu().numpy(), top.v.cpu().numpy()
    return result


def _token_families(
    engine: JacobianEngine, layers: list[int], n: int, config: MeasureConfig
) -> TokenResult:
    """All ``J^l_{t1 t2}`` (t1 <= t2) at the token layers, and the statistics of the three families."""
    k = config.k_max
    index = {
        (t1, t2): i for i, (t1, t2) in enumerate((a, b) for b in range(n) for a in range(b + 1))
    }
    jacs, tops = {}, {}
    result = TokenResult()
    for layer in layers:
        per_output = []
        for t2 in range(n):
            per_output.append(
                engine.output_token(layer, t2)[: t2 + 1]
            )  # t1 <= t2 (encoders return every t1)
        jacs[layer] = torch.cat(per_output)  # (pairs, d, d) in `index` order
        factors = svd(jacs[layer])
        tops[layer] = factors.top(k)
        s = np.full((n, n, k), np.nan)
        for (t1, t2), i in index.items():
            s[t1, t2] = factors.s[i, :k].double().cpu().numpy()
        result.s[layer] = s
    groups = {
        "self": [[index[(t, t)] for t in range(n)]],
        "fixed_in": [[index[(t1, t2)] for t2 in range(t1, n)] for t1 in range(n)],
        "fixed_out": [[index[(t1, t2)] for t1 in range(t2 + 1)] for t2 in range(n)],
    }
    shapes = {"self": (n, n), "fixed_in": (n, n, n), "fixed_out": (n, n, n)}
    n_var = len(config.variants)
    for family, members in groups.items():
        result.families[family] = {}
        for layer in layers:
            for layer_ref in layers:
                diag = np.full((n_var, *shapes[family], k), np.nan)
                corner = np.full((n_var, *shapes[family], k), np.nan)
                for fixed, group in enumerate(members):
                    pick = torch.tensor(group)
                    positions = _family_positions(family, fixed, n)
                    for v, variant in enumerate(config.variants):
                        left, right = bases(tops[layer_ref], variant)
                        d_, c_ = cross_stats(jacs[layer][pick], left[pick], right[pick])
                        region = (v, *positions) if family != "self" else (v,)
                        diag[region] = d_.cpu().numpy()
                        corner[region] = c_.cpu().numpy()
                result.families[family][(layer, layer_ref)] = (diag, corner)
    return result


def _family_positions(family: str, fixed: int, n: int) -> tuple[Any, ...]:
    """Where a group's (member x member) block lands in the family array."""
    if family == "fixed_in":  # [token_in=t1, token=t2, token_ref=t2'] for t2, t2' >= t1
        return (fixed, slice(fixed, n), slice(fixed, n))
    if family == "fixed_out":  # [token_out=t2, token=t1, token_ref=t1'] for t1, t1' <= t2
        return (fixed, slice(0, fixed + 1), slice(0, fixed + 1))
    return ()


def measure(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[Any],
    config: MeasureConfig = MeasureConfig(),
    attrs: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, xr.Dataset]:
    """Extract Jacobian statistics and trajectory metrics for each text prompt.

    ``prompts``: strings, mappings with ``text`` or ``prompts.Prompt`` objects. Returns datasets
    ``depth``, ``spectra``, ``tokens`` (empty when no token layers or prompts are configured)
    and ``trajectories``, with the dims of docs/datasets.md; runs wherever the model sits.
    ``attrs`` are added to every dataset (model id, revision, ...).
    """
    items = as_prompts(prompts)
    limit = context_length(model)
    device = next(model.parameters()).device
    inputs = [
        {"input_ids": tokenize(tokenizer, p, config.max_tokens, limit).to(device)} for p in items
    ]
    return measure_inputs(model, inputs, items, config, attrs, progress)


def measure_inputs(
    model: nn.Module,
    inputs: Sequence[dict[str, torch.Tensor]],
    items: Sequence[PromptText],
    config: MeasureConfig = MeasureConfig(),
    attrs: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, xr.Dataset]:
    """``measure`` for any model inputs: ``inputs[i]`` are the model's keyword inputs of item
    ``i`` with batch size 1 (``input_ids (1, token)``, ``pixel_values (1, C, H, W)``, ...); the
    token count is what the blocks see (e.g. patches plus a class token).
    """
    if len(inputs) != len(items):
        raise ValueError(f"{len(inputs)} inputs for {len(items)} items")
    n_layers = len(blocks_of(model))
    d_model = getattr(model.config, "hidden_size", None)
    if isinstance(d_model, int) and config.k_max > d_model:
        raise ValueError(f"K={config.k_max} exceeds the hidden size d={d_model}")
    token_layers = _resolve_layers(config.token_layers, n_layers)
    n_token_prompts = min(config.token_prompts, len(items)) if token_layers else 0
    depth_results: list[DepthResult] = []
    token_results: list[TokenResult] = []
    trajectory_states: list[np.ndarray] = []
    lengths: list[int] = []
    depth_positions: list[int] = []
    with eager_attention(model):
        for i in track(
            range(len(items)), len(items), "block Jacobians", lambda i: items[i].id, progress
        ):
            engine = JacobianEngine(model, dict(inputs[i]), chunk_size=config.chunk_size)
            n = engine.n_tokens
            lengths.append(n)
            depth_positions.append(_resolve_position(config.depth_token, n, "depth_token"))
            trajectory_states.append(states(engine.full).double().cpu().numpy())
            depth_results.append(_depth(engine, depth_positions[-1], config, n_layers))
            if i < n_token_prompts:
                token_results.append(_token_families(engine, token_layers, n, config))
    common = dict(attrs or {})
    common.update(measure_config=str(asdict(config)), k_max=config.k_max)
    prompt_coords = {
        "prompt": [p.id for p in items],
        "prompt_source": ("prompt", [p.source for p in items]),
        "n_tokens": ("prompt", lengths),
    }
    return {
        "depth": depth_dataset(depth_results, prompt_coords, depth_positions, config, common),
        "spectra": spectra_dataset(depth_results, prompt_coords, common),
        "tokens": tokens_dataset(
            token_results, list(items[:n_token_prompts]), lengths, token_layers, config, common
        ),
        "trajectories": trajectory_dataset(trajectory_states, prompt_coords, config, common),
    }
