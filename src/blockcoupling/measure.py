"""The one-call API: ``measure(model, tokenizer, prompts)`` -> xarray datasets (docs/datasets.md).

Shared by the workflow's rules and by notebooks. Per prompt: one recorded forward pass, the
depth-wise Jacobians ``J^l_{tt}`` at the depth token for every block, optionally every
``J^l_{t1 t2}`` at the token layers, their SVDs, the exact coupling statistics of every pair, and
the trajectory metrics of every token. ``metrics.coupling_dataset`` then turns statistics into m_K.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import nn
from tqdm.auto import tqdm

from blockcoupling import trajectories
from blockcoupling.capture import states
from blockcoupling.coupling import VARIANTS, bases, check_option, cross_stats
from blockcoupling.jacobians import JacobianEngine
from blockcoupling.models import blocks_of
from blockcoupling.spectral import svd


@dataclass(frozen=True)
class MeasureConfig:
    """What to extract.

    k_max: singular triplets kept per Jacobian (the largest K of m_K later); variants: ujv/vju;
    depth_token: position of the depth-wise token (negative: from the end); token_layers: blocks
    (1-based, negative from the end) for the token families; token_prompts: how many prompts (the
    first ones) get token families; max_tokens: truncate prompts to this many tokens (None: keep);
    store_factors: keep top-K_max U, V of the depth Jacobians; chunk_size: VJPs per vmap batch.
    """

    k_max: int = 50
    variants: tuple[str, ...] = VARIANTS
    depth_token: int = -1
    token_layers: tuple[int, ...] = ()
    token_prompts: int = 0
    max_tokens: int | None = None
    store_factors: bool = False
    chunk_size: int | None = None
    pca_components: int = 2

    def __post_init__(self) -> None:
        for variant in self.variants:
            check_option("variant", variant, VARIANTS)
        if self.k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {self.k_max}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2, got {self.max_tokens}")


@dataclass(frozen=True)
class PromptText:
    """A prompt as measure() sees it."""

    id: str
    source: str
    text: str


def as_prompts(prompts: Sequence[Any]) -> list[PromptText]:
    """Accept strings or objects with ``id``, ``source``, ``text`` (e.g. ``prompts.Prompt``)."""
    result = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            result.append(PromptText(f"p{i:04d}", "text", prompt))
        else:
            result.append(
                PromptText(str(prompt.id), str(getattr(prompt, "source", "text")), str(prompt.text))
            )
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


@dataclass
class _DepthResult:
    s: np.ndarray  # (layer, d)
    diag: np.ndarray  # (variant, layer, layer_ref, rank)
    corner: np.ndarray  # (variant, layer, layer_ref, k)
    u: np.ndarray | None = None  # (layer, d, rank)
    v: np.ndarray | None = None


def _depth(
    engine: JacobianEngine, t: int, config: MeasureConfig, n_layers: int, bar: tqdm
) -> _DepthResult:
    jacs = []
    for layer in range(1, n_layers + 1):
        jacs.append(engine.diagonal(layer, t))
        bar.update(1)
    jac = torch.stack(jacs)
    factors = svd(jac)
    top = factors.top(config.k_max)
    stats = [cross_stats(jac, *bases(top, variant)) for variant in config.variants]
    result = _DepthResult(
        factors.s.double().cpu().numpy(),
        np.stack([d.cpu().numpy() for d, _ in stats]),
        np.stack([c.cpu().numpy() for _, c in stats]),
    )
    if config.store_factors:
        result.u, result.v = top.u.cpu().numpy(), top.v.cpu().numpy()
    return result


@dataclass
class _TokenResult:
    s: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (token_in, token_out, rank)
    families: dict[str, dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]] = field(
        default_factory=dict
    )


def _token_families(
    engine: JacobianEngine, layers: list[int], n: int, config: MeasureConfig, bar: tqdm
) -> _TokenResult:
    """All ``J^l_{t1 t2}`` (t1 <= t2) at the token layers, and the statistics of the three families."""
    k = config.k_max
    index = {
        (t1, t2): i for i, (t1, t2) in enumerate((a, b) for b in range(n) for a in range(b + 1))
    }
    jacs, tops = {}, {}
    result = _TokenResult()
    for layer in layers:
        per_output = []
        for t2 in range(n):
            per_output.append(
                engine.output_token(layer, t2)[: t2 + 1]
            )  # t1 <= t2 (encoders return every t1)
            bar.update(1)
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


def _pad(arrays: list[np.ndarray], axes: Sequence[int]) -> np.ndarray:
    """Stack arrays along a new first axis, NaN-padding the given (token) axes to the maximum."""
    shape = list(arrays[0].shape)
    for axis in axes:
        shape[axis] = max(a.shape[axis] for a in arrays)
    out = np.full((len(arrays), *shape), np.nan)
    for i, array in enumerate(arrays):
        out[(i, *tuple(slice(0, s) for s in array.shape))] = array
    return out


def measure(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[Any],
    config: MeasureConfig = MeasureConfig(),
    attrs: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, xr.Dataset]:
    """Extract Jacobian statistics and trajectory metrics for each prompt.

    Returns datasets ``depth``, ``spectra``, ``tokens`` (empty when no token layers or prompts are
    configured) and ``trajectories``, with the dims of docs/datasets.md; runs wherever the model
    sits. ``attrs`` are added to every dataset (model id, revision, ...).
    """
    items = as_prompts(prompts)
    n_layers = len(blocks_of(model))
    d_model = int(model.config.hidden_size) if hasattr(model.config, "hidden_size") else None
    if d_model is not None and config.k_max > d_model:
        raise ValueError(f"K={config.k_max} exceeds the hidden size d={d_model}")
    limit = context_length(model)
    device = next(model.parameters()).device
    token_layers = _resolve_layers(config.token_layers, n_layers)
    ids = [tokenize(tokenizer, p, config.max_tokens, limit).to(device) for p in items]
    lengths = [int(i.shape[1]) for i in ids]
    depth_positions = [_resolve_position(config.depth_token, n, "depth_token") for n in lengths]
    n_token_prompts = min(config.token_prompts, len(items)) if token_layers else 0
    total = n_layers * len(items) + sum(
        len(token_layers) * lengths[i] for i in range(n_token_prompts)
    )
    depth_results: list[_DepthResult] = []
    token_results: list[_TokenResult] = []
    trajectory_states: list[np.ndarray] = []
    with (
        eager_attention(model),
        tqdm(total=total, desc="block Jacobians", unit="vjp-batch", disable=not progress) as bar,
    ):
        for i, prompt in enumerate(items):
            bar.set_postfix_str(prompt.id)
            engine = JacobianEngine(model, {"input_ids": ids[i]}, chunk_size=config.chunk_size)
            trajectory_states.append(states(engine.full).double().cpu().numpy())
            depth_results.append(_depth(engine, depth_positions[i], config, n_layers, bar))
            if i < n_token_prompts:
                token_results.append(_token_families(engine, token_layers, lengths[i], config, bar))
    common = dict(attrs or {})
    common.update(measure_config=str(asdict(config)), k_max=config.k_max)
    prompt_coords = {
        "prompt": [p.id for p in items],
        "prompt_source": ("prompt", [p.source for p in items]),
        "n_tokens": ("prompt", lengths),
    }
    return {
        "depth": _depth_dataset(depth_results, prompt_coords, depth_positions, config, common),
        "spectra": _spectra_dataset(depth_results, prompt_coords, common),
        "tokens": _tokens_dataset(
            token_results, items[:n_token_prompts], lengths, token_layers, config, common
        ),
        "trajectories": _trajectory_dataset(trajectory_states, prompt_coords, config, common),
    }


def _depth_dataset(
    results: list[_DepthResult],
    prompt_coords: dict[str, Any],
    positions: list[int],
    config: MeasureConfig,
    attrs: dict[str, Any],
) -> xr.Dataset:
    n_layers = results[0].s.shape[0]
    k = config.k_max
    dims_pair = ("variant", "prompt", "layer", "layer_ref")
    data = {
        "singular_values": (("prompt", "layer", "rank"), np.stack([r.s[:, :k] for r in results])),
        "depth_diag": ((*dims_pair, "rank"), np.stack([r.diag for r in results], axis=1)),
        "depth_corner": ((*dims_pair, "k"), np.stack([r.corner for r in results], axis=1)),
    }
    if config.store_factors:
        data["u"] = (
            ("prompt", "layer", "dim", "rank"),
            np.stack([r.u for r in results]).astype(np.float32),
        )
        data["v"] = (
            ("prompt", "layer", "dim", "rank"),
            np.stack([r.v for r in results]).astype(np.float32),
        )
    coords = {
        **prompt_coords,
        "token_position": ("prompt", positions),
        "layer": np.arange(1, n_layers + 1),
        "layer_ref": np.arange(1, n_layers + 1),
        "rank": np.arange(k),
        "k": np.arange(1, k + 1),
        "variant": list(config.variants),
    }
    ds = xr.Dataset(data, coords=coords, attrs=attrs)
    ds["depth_diag"].attrs["description"] = (
        "A[a, a] of A = P_j^T J_i Q_j, J_i = J^layer_tt, j = layer_ref"
    )
    ds["depth_corner"].attrs["description"] = "sum_{a,b<k} A[a, b]^2"
    return ds


def _spectra_dataset(
    results: list[_DepthResult], prompt_coords: dict[str, Any], attrs: dict[str, Any]
) -> xr.Dataset:
    s = np.stack([r.s for r in results])
    coords = {**prompt_coords, "layer": np.arange(1, s.shape[1] + 1), "rank": np.arange(s.shape[2])}
    ds = xr.Dataset(
        {"singular_values": (("prompt", "layer", "rank"), s)}, coords=coords, attrs=attrs
    )
    ds["singular_values"].attrs["description"] = "full spectrum of J^layer_tt at the depth token"
    return ds


FAMILY_DIMS = {
    "self": ("token", "token_ref"),
    "fixed_in": ("token_in", "token", "token_ref"),
    "fixed_out": ("token_out", "token", "token_ref"),
}


def _tokens_dataset(
    results: list[_TokenResult],
    items: list[PromptText],
    lengths: list[int],
    layers: list[int],
    config: MeasureConfig,
    attrs: dict[str, Any],
) -> xr.Dataset:
    if not results:
        return xr.Dataset(attrs={**attrs, "empty": "no token layers or token prompts configured"})
    k = config.k_max
    n_max = max(lengths[: len(results)])
    s = _pad([np.stack([r.s[layer] for layer in layers]) for r in results], axes=(1, 2))
    data: dict[str, Any] = {
        "singular_values": (("prompt", "layer", "token_in", "token_out", "rank"), s)
    }
    for family, token_dims in FAMILY_DIMS.items():
        for stat, last in (("diag", "rank"), ("corner", "k")):
            per_prompt = []
            for r in results:
                pick = 0 if stat == "diag" else 1
                grid = np.stack(
                    [
                        np.stack([r.families[family][(a, b)][pick] for b in layers], axis=1)
                        for a in layers
                    ],
                    axis=1,
                )
                per_prompt.append(grid)  # (variant, layer, layer_ref, *tokens, K)
            axes = tuple(range(3, 3 + len(token_dims)))
            stacked = _pad(per_prompt, axes)  # (prompt, variant, layer, layer_ref, *tokens, K)
            stacked = np.moveaxis(stacked, 1, 0)
            data[f"{family}_{stat}"] = (
                ("variant", "prompt", "layer", "layer_ref", *token_dims, last),
                stacked,
            )
    tokens = np.arange(n_max)
    coords = {
        "prompt": [p.id for p in items],
        "prompt_source": ("prompt", [p.source for p in items]),
        "n_tokens": ("prompt", lengths[: len(results)]),
        "layer": layers,
        "layer_ref": layers,
        "token": tokens,
        "token_ref": tokens,
        "token_in": tokens,
        "token_out": tokens,
        "rank": np.arange(k),
        "k": np.arange(1, k + 1),
        "variant": list(config.variants),
    }
    return xr.Dataset(data, coords=coords, attrs=attrs)


def _trajectory_dataset(
    all_states: list[np.ndarray],
    prompt_coords: dict[str, Any],
    config: MeasureConfig,
    attrs: dict[str, Any],
) -> xr.Dataset:
    per_prompt = []
    for x in all_states:
        projection, explained = trajectories.pca_projection(x, config.pca_components)
        per_prompt.append(
            (
                trajectories.line_shape_score(x),
                trajectories.expodistance(x),
                trajectories.spacing_cv(x),
                trajectories.step_norms(x),
                projection,
                explained,
            )
        )
    lss, ed, cv = (_pad([p[i] for p in per_prompt], axes=(0,)) for i in range(3))
    steps = _pad([p[3] for p in per_prompt], axes=(1,))
    pca = _pad([p[4] for p in per_prompt], axes=(1,))
    explained = np.stack([p[5] for p in per_prompt])
    n_states = all_states[0].shape[0]
    coords = {
        **prompt_coords,
        "token": np.arange(lss.shape[1]),
        "layer": np.arange(n_states),
        "pc": np.arange(config.pca_components),
    }
    data = {
        "lss": (("prompt", "token"), lss),
        "expodistance": (("prompt", "token"), ed),
        "spacing_cv": (("prompt", "token"), cv),
        "step_norm": (
            ("prompt", "layer", "token"),
            np.concatenate([np.full((len(per_prompt), 1, steps.shape[2]), np.nan), steps], axis=1),
        ),
        "pca": (("prompt", "layer", "token", "pc"), pca),
        "pca_explained": (("prompt", "pc"), explained),
    }
    ds = xr.Dataset(data, coords=coords, attrs=attrs)
    ds["step_norm"].attrs["description"] = "||x^l - x^(l-1)||; NaN at layer 0"
    return ds
