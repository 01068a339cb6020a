"""The one-call API: ``extract(model, tokenizer, prompts)`` -> xarray datasets (docs/datasets.md).

Shared by the workflow's rules and by notebooks. Per prompt: one recorded forward pass, the
depth-wise Jacobians ``J^l_{tt}`` at the depth token for every block, optionally every
``J^l_{t1 t2}`` at the token layers, their SVDs, the exact coupling statistics of every pair, and
the trajectory metrics of every token. ``extract_inputs`` is the same for any model inputs (image
models); ``metrics.coupling_dataset`` then turns statistics into m_K.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import nn

from blockcoupling.coupling.arguments import expect
from blockcoupling.jacobians.adapters import blocks_of
from blockcoupling.jacobians.capture import states
from blockcoupling.jacobians.datasets import (
    DepthResult,
    TokenResult,
    depth_dataset,
    spectra_dataset,
    tokens_dataset,
    trajectory_dataset,
)
from blockcoupling.jacobians.engine import (
    FULL_SEQUENCE,
    METHODS,
    JacobianEngine,
    MethodChoice,
    is_accelerator,
    log,
)
from blockcoupling.jacobians.gram import gram_top_k
from blockcoupling.jacobians.options import ExtractConfig, PromptText
from blockcoupling.jacobians.run_mode import eager_attention, eval_mode, matmul_precision
from blockcoupling.jacobians.spectral import SVD, singular_values, svd, top_k
from blockcoupling.jacobians.statistics import (
    basis_corners,
    pair_stats,
    spectrum_sums,
)
from blockcoupling.runtime.progress import track

__all__ = ["ExtractConfig", "PromptText", "as_prompts", "extract", "extract_inputs"]


def _field(prompt: Any, key: str, default: Any) -> Any:
    """A prompt's field, from a mapping or an attribute."""
    if isinstance(prompt, Mapping):
        return prompt.get(key, default)
    return getattr(prompt, key, default)


def as_prompts(prompts: Sequence[Any]) -> list[PromptText]:
    """Accept strings, mappings with ``text`` (and optional ``id``, ``source``), or objects with
    ``id``, ``source``, ``text`` attributes (e.g. ``prompts.Prompt``).
    """
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Iterable):
        raise TypeError(
            f"prompts: expected a list of prompts (e.g. [{str(prompts)[:30]!r}]), got "
            f"{type(prompts).__name__}: a string would be measured per character"
        )
    result = []
    for i, prompt in enumerate(prompts):
        text = prompt if isinstance(prompt, str) else _field(prompt, "text", None)
        if not isinstance(text, str):
            raise ValueError(
                f"prompt {i}: needs a text (a string, or a mapping/object with 'text')"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(
                f"prompt {i}: not UTF-8 text (a lone surrogate at character {error.start}, "
                "e.g. bytes decoded with surrogateescape); give UTF-8 text"
            ) from None
        if isinstance(prompt, str):
            result.append(PromptText(f"p{i:04d}", "text", prompt))
            continue
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
            f"prompt {prompt.id!r} has {ids.shape[1]} tokens, "
            f"longer than the model's context of {limit}; "
            "set max_tokens"
        )
    return ids


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


def _depth(
    engine: JacobianEngine, t: int, config: ExtractConfig, n_layers: int, spectrum: bool
) -> DepthResult:
    """Statistics of every depth pair at token t; the full spectra when ``spectrum``."""
    jac = None  # (layer, d, d), filled in place: L d^2 floats at the peak, never twice that
    for layer in range(1, n_layers + 1):
        one = engine.diagonal(layer, t)
        if jac is None:
            jac = one.new_empty((n_layers, *one.shape))
        jac[layer - 1] = one
        del one
    top, values, sums = _spectra(jac, config, spectrum)
    stats = pair_stats(jac, top, config.variants)
    result = DepthResult(
        _np(top.s).astype(np.float64),
        _np(stats[0]),
        _np(stats[1]),
        spectrum=None if values is None else _np(values).astype(np.float64),
        ucorner=_np(basis_corners(top.u)),
        vcorner=_np(basis_corners(top.v)),
        sv_sum2=_np(sums[0]),
        sv_sum4=_np(sums[1]),
    )
    if config.store_factors:
        result.u, result.v = _np(top.u), _np(top.v)
    return result


def _spectra(
    jac: torch.Tensor, config: ExtractConfig, spectrum: bool
) -> tuple[SVD, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
    """Top-``k_max`` factors of ``jac (layer, d, d)``, every singular value ``(layer, d)`` when
    ``spectrum`` (else None), and ``sum s^2``, ``sum s^4`` of each full spectrum ``(layer,)``.
    A prompt that asks for the spectrum takes the dense SVD unless ``topk`` was resolved (at
    d = 576 one SVD costs less than the Gram path plus ``svdvals``).
    """
    method = config.svd.resolve(jac.shape[-1], config.k_max)
    if method == "dense" or (spectrum and method == "gram"):  # every singular value comes free
        full = svd(jac)
        return full.top(config.k_max), full.s if spectrum else None, spectrum_sums(jac, full.s)
    if method == "gram":
        factors, sum2, sum4 = gram_top_k(jac, config.k_max)
        return factors, None, (sum2, sum4)
    top = top_k(jac, config.k_max, config.svd)
    values = singular_values(jac) if spectrum else None
    return top, values, spectrum_sums(jac, values)


TOKEN_HOLD_BYTES = 2 << 30  # the families' Jacobians kept between their two uses on a CPU
TOKEN_HOLD_FRACTION = 0.8  # ... and on a GPU: this fraction of its free memory


def token_hold_bytes(device: torch.device) -> float:
    """The most bytes of token-family Jacobians kept between their two uses on ``device``:
    ``TOKEN_HOLD_BYTES`` on a CPU, ``TOKEN_HOLD_FRACTION`` of the free memory of a GPU.
    """
    if device.type == "cuda":
        return TOKEN_HOLD_FRACTION * torch.cuda.mem_get_info(device)[0]
    return TOKEN_HOLD_BYTES


def _token_families(
    engine: JacobianEngine, layers: list[int], n: int, config: ExtractConfig
) -> TokenResult:
    """The statistics of the three token families at the token layers, every ``J^l_{t1 t2}``
    (t1 <= t2 < n) computed once, by one batch of d VJPs per output token and layer on its
    prefix, and shared by both context families.

    Fixed output: for each t2, every ``J^l_{t1 t2}`` (t1 <= t2) from the VJPs of t2, compared
    within the group; their spectra and top-K factors are kept (``2 d K`` floats each). Fixed
    input: each ``J^l_{t1 t2}`` against the kept factors of every ``J^{l'}_{t1 t2'}``
    (t2' >= t1): the groups of the first pass that fit ``token_hold_bytes`` are kept, the
    others are computed again by the same VJPs. Self: each
    ``J^l_{tt}`` is recomputed (single-token path) and compared with the kept factors of every
    ``J^{l'}_{t't'}``.
    """
    k, variants = config.k_max, config.variants
    result = TokenResult(s={layer: np.full((n, n, k), np.nan) for layer in layers})
    result.sv_sum2 = {layer: np.full((n, n), np.nan) for layer in layers}
    result.sv_sum4 = {layer: np.full((n, n), np.nan) for layer in layers}
    shapes = {"self": (n, n), "fixed_in": (n, n, n), "fixed_out": (n, n, n)}
    for family, shape in shapes.items():
        result.families[family] = {
            pair: (
                np.full((len(variants), *shape, k), np.nan),
                np.full((len(variants), *shape, k), np.nan),
            )
            for pair in itertools.product(layers, layers)
        }
        result.bases[family] = {
            pair: (np.full((*shape, k), np.nan), np.full((*shape, k), np.nan))
            for pair in itertools.product(layers, layers)
        }
    factors: dict[int, list[SVD]] = {layer: [] for layer in layers}  # [t2]: J^l_{t1 t2}, t1 <= t2
    held: dict[tuple[int, int], torch.Tensor] = {}  # (layer, t2) -> group, while they fit
    room = None
    for t2 in range(n):
        jacs = {layer: engine.output_token(layer, t2)[: t2 + 1] for layer in layers}
        where = (t2, slice(0, t2 + 1))
        tops = _family_stats(jacs, config, result.families["fixed_out"], where)
        _basis_stats(tops, result.bases["fixed_out"], where)
        for layer in layers:
            result.s[layer][: t2 + 1, t2] = _np(tops[layer].s)
            sum2, sum4 = spectrum_sums(jacs[layer])
            result.sv_sum2[layer][: t2 + 1, t2], result.sv_sum4[layer][: t2 + 1, t2] = (
                _np(sum2),
                _np(sum4),
            )
            factors[layer].append(tops[layer])
        if room is None:
            room = token_hold_bytes(jacs[layers[0]].device)
        for layer in layers:  # the groups kept for the fixed-input family, while they fit
            group = jacs[layer]
            size = group.numel() * group.element_size()
            if size <= room:  # a copy where the group is part of the VJPs' t1 > t2 too (ViT)
                whole = group.untyped_storage().nbytes() == size
                held[(layer, t2)], room = group if whole else group.clone(), room - size
        del jacs
    by_input = {  # [t1]: the factors of J^l_{t1 t2}, t2 = t1..n-1
        layer: [
            SVD(
                *(
                    torch.stack(parts)
                    for parts in zip(*(factors[layer][t2].pick(t1) for t2 in range(t1, n)))
                )
            )
            for t1 in range(n)
        ]
        for layer in layers
    }
    for t1 in range(n):
        _basis_stats(
            {layer: by_input[layer][t1] for layer in layers},
            result.bases["fixed_in"],
            (t1, slice(t1, n)),
        )
    for layer in layers:
        for t2 in range(n):
            jac = held.pop((layer, t2), None)
            jac = engine.output_token(layer, t2)[: t2 + 1] if jac is None else jac
            for t1, layer_ref in itertools.product(range(t2 + 1), layers):
                d_, c_ = pair_stats(jac[t1 : t1 + 1], by_input[layer_ref][t1], variants)
                diag, corner = result.families["fixed_in"][(layer, layer_ref)]
                diag[:, t1, t2, t1:n], corner[:, t1, t2, t1:n] = _np(d_[:, 0]), _np(c_[:, 0])
            del jac
    stacked = {
        layer: SVD(
            *(torch.stack(parts) for parts in zip(*(factors[layer][t].pick(t) for t in range(n))))
        )
        for layer in layers
    }
    for layer, t in itertools.product(layers, range(n)):
        jac = engine.diagonal(layer, t)[None]
        for layer_ref in layers:
            d_, c_ = pair_stats(jac, stacked[layer_ref], variants)  # (variant, 1, n, K)
            diag, corner = result.families["self"][(layer, layer_ref)]
            diag[:, t], corner[:, t] = _np(d_[:, 0]), _np(c_[:, 0])
    for pair, u, v in _pair_corners(stacked):
        ucorner, vcorner = result.bases["self"][pair]
        ucorner[...], vcorner[...] = u, v
    return result


def _pair_corners(tops: dict[int, SVD]) -> Iterator[tuple[tuple[int, int], np.ndarray, np.ndarray]]:
    """``((layer, layer_ref), ucorner, vcorner)`` of every ordered pair of layers of ``tops``
    (``basis_corners`` of their U and of their V), each unordered pair computed once: the
    reverse pair's corners are the same with the two member axes swapped.
    """
    for layer, layer_ref in itertools.combinations_with_replacement(tops, 2):
        if layer == layer_ref:
            yield (
                (layer, layer),
                _np(basis_corners(tops[layer].u)),
                _np(basis_corners(tops[layer].v)),
            )
            continue
        u = _np(basis_corners(tops[layer].u, tops[layer_ref].u))
        v = _np(basis_corners(tops[layer].v, tops[layer_ref].v))
        yield (layer, layer_ref), u, v
        yield (layer_ref, layer), u.transpose(1, 0, 2), v.transpose(1, 0, 2)


def _basis_stats(
    tops: dict[int, SVD],
    family: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]],
    where: tuple[int, slice],
) -> None:
    """Basis corner sums of every pair of one group into
    ``family[(layer, layer_ref)] = (ucorner, vcorner)[fixed, members, members]``.
    """
    fixed, members = where
    for pair, u, v in _pair_corners(tops):
        ucorner, vcorner = family[pair]
        ucorner[fixed, members, members], vcorner[fixed, members, members] = u, v


def _family_stats(
    jacs: dict[int, torch.Tensor],
    config: ExtractConfig,
    family: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]],
    where: tuple[int, slice],
) -> dict[int, SVD]:
    """Statistics of every pair of one group (``jacs[layer] (member, d, d)``, the same members
    for every layer) into ``family[(layer, layer_ref)][v, fixed, members, members]``, where
    ``where = (fixed, members)``; returns each layer's top-K factors.
    """
    fixed, members = where
    tops = {layer: top_k(jac, config.k_max, config.svd) for layer, jac in jacs.items()}
    for layer, layer_ref in itertools.product(jacs, jacs):
        d_, c_ = pair_stats(jacs[layer], tops[layer_ref], config.variants)
        diag, corner = family[(layer, layer_ref)]
        diag[:, fixed, members, members], corner[:, fixed, members, members] = _np(d_), _np(c_)
    return tops


class PathRecord:
    """How every ``J_tt`` of a job was taken, per block, and every refusal with its prompt: the
    depth dataset's attrs (docs/datasets.md) and one log line per model.
    """

    def __init__(self) -> None:
        self.methods: Counter[tuple[int, str]] = Counter()
        self.refusals: list[dict[str, Any]] = []

    def add(self, engine: JacobianEngine, prompt: str) -> None:
        self.methods.update(engine.methods)
        self.refusals += [{"prompt": prompt, **asdict(r)} for r in engine.refused]

    def counts(self) -> dict[str, int]:
        return {m: sum(n for (_, mm), n in self.methods.items() if mm == m) for m in METHODS}

    def attrs(self, choice: MethodChoice) -> dict[str, Any]:
        """``jtt_composed``, ``jtt_autograd``, ``jtt_full_sequence`` (counts), ``jtt_methods``
        (JSON: block -> method -> count), ``jtt_refusals`` (JSON list) and ``jtt_choice``.
        """
        counts = self.counts()
        by_block: dict[str, dict[str, int]] = {}
        for (layer, method), n in sorted(self.methods.items()):
            by_block.setdefault(str(layer), {})[method] = n
        return {
            "jtt_composed": counts["composed"],
            "jtt_autograd": counts["single-token autograd"],
            "jtt_full_sequence": counts[FULL_SEQUENCE],
            "jtt_methods": json.dumps(by_block),
            "jtt_refusals": json.dumps(self.refusals),
            "jtt_choice": choice.method or "the composition wherever it passes",
        }

    def log(self, model: str, choice: MethodChoice) -> None:
        """One line: the counts of each method and of the refusals, the commonest reason."""
        counts = ", ".join(f"{method} {n}" for method, n in self.counts().items())
        line = f"{model}: J_tt by {counts}; {len(self.refusals)} refusals"
        if self.refusals:
            reasons = Counter(f"{r['path']}: {r['reason']}" for r in self.refusals)
            reason, n = reasons.most_common(1)[0]
            line += f" (commonest, {n}x: {reason}; all in the depth file's attrs jtt_refusals)"
            log.warning(line)
        else:
            log.info(line)


def _device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def extract(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[Any],
    config: ExtractConfig = ExtractConfig(),
    attrs: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, xr.Dataset]:
    """Extract the block Jacobians' statistics and the trajectory metrics of text prompts.

    Runs wherever the model sits; the coupling measures come after, from the statistics
    (``coupling_dataset``).

    Parameters
    ----------
    model : torch.nn.Module
        A loaded model (``load_model``, ``load_random_twin``) whose architecture is in the
        adapter table (``jacobians.adapters.ADAPTERS``).
    tokenizer : Any
        Its tokenizer.
    prompts : sequence
        Strings, mappings with ``text`` (and optionally ``id``, ``source``) or
        ``lm.text.prompts.Prompt`` objects.
    config : ExtractConfig
        What to extract (K_max, variants, token families, ...).
    attrs : dict, optional
        Added to every dataset's attrs (model id, revision, ...).
    progress : bool
        Show a progress bar on a terminal.

    Returns
    -------
    dict of str to xarray.Dataset
        ``depth``, ``spectra``, ``tokens`` (empty when no token layers or prompts are
        configured) and ``trajectories``, with the dims of docs/datasets.md.

    Examples
    --------
    >>> import blockcoupling as bc
    >>> model, tokenizer = bc.load_model("hub:gpt2", device="cpu")  # doctest: +SKIP
    >>> config = bc.ExtractConfig(k_max=10)
    >>> data = bc.extract(model, tokenizer, ["2 + 2 ="], config)  # doctest: +SKIP
    >>> sorted(data)  # doctest: +SKIP
    ['depth', 'spectra', 'tokens', 'trajectories']
    """
    expect(model, nn.Module, "extract(model=...)")
    expect(config, ExtractConfig, "extract(config=...)")
    if attrs is not None:
        expect(attrs, dict, "extract(attrs=...)")
    items = as_prompts(prompts)
    limit = context_length(model)
    device = next(model.parameters()).device
    inputs = [
        {"input_ids": tokenize(tokenizer, p, config.max_tokens, limit).to(device)} for p in items
    ]
    return extract_inputs(model, inputs, items, config, attrs, progress)


def extract_inputs(
    model: nn.Module,
    inputs: Sequence[dict[str, torch.Tensor]],
    items: Sequence[PromptText],
    config: ExtractConfig = ExtractConfig(),
    attrs: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, xr.Dataset]:
    """``extract`` for any model inputs: ``inputs[i]`` are the model's keyword inputs of item
    ``i`` with batch size 1 (``input_ids (1, token)``, ``pixel_values (1, C, H, W)``, ...); the
    token count is what the blocks see (e.g. patches plus a class token).
    """
    if len(inputs) != len(items):
        raise ValueError(f"{len(inputs)} inputs for {len(items)} items")
    n_layers = len(blocks_of(model))
    d_model = getattr(getattr(model, "config", None), "hidden_size", None)
    d_model = d_model if d_model is not None else getattr(model, "embed_dim", None)
    if isinstance(d_model, int) and config.k_max > d_model:
        raise ValueError(f"K={config.k_max} exceeds the hidden size d={d_model}")
    token_layers = _resolve_layers(config.token_layers, n_layers)
    n_jacobian_prompts = config.jacobian_count(len(items))
    n_token_prompts = min(config.token_prompts, n_jacobian_prompts) if token_layers else 0
    depth_results: list[DepthResult] = []
    token_results: list[TokenResult] = []
    trajectory_states: list[np.ndarray] = []
    lengths: list[int] = []
    family_tokens: list[int] = []  # tokens of the token families (token_max_tokens at most)
    depth_positions: list[int] = []
    record = PathRecord()  # every J_tt's method and every refusal, over the prompts
    choice = MethodChoice(select=is_accelerator(_device(model)))
    with eager_attention(model), eval_mode(model), matmul_precision(config.tf32):
        for i in track(
            range(len(items)), len(items), "block Jacobians", lambda i: items[i].id, progress
        ):
            label = f"model {attrs['model']}, " if attrs and "model" in attrs else ""
            engine = JacobianEngine(
                model,
                dict(inputs[i]),
                config.chunk_size,
                f"{label}prompt {items[i].id}",
                choice,
                config.allow_full_sequence,
            )
            n = engine.n_tokens
            lengths.append(n)
            depth_positions.append(_resolve_position(config.depth_token, n, "depth_token"))
            trajectory_states.append(states(engine.full).double().cpu().numpy())
            if i >= n_jacobian_prompts:  # forward-pass measures only
                continue
            spectrum = config.spectra_prompts is None or i < config.spectra_prompts
            try:
                depth_results.append(
                    _depth(engine, depth_positions[-1], config, n_layers, spectrum)
                )
                if i < n_token_prompts:
                    family_tokens.append(min(n, config.token_max_tokens or n))
                    token_results.append(
                        _token_families(engine, token_layers, family_tokens[-1], config)
                    )
            finally:
                record.add(engine, items[i].id)
    if n_jacobian_prompts:
        record.log(attrs["model"] if attrs and "model" in attrs else "the model", choice)
    common = {
        "extract_config": str(asdict(config)),
        "k_max": config.k_max,
        "hidden_size": int(trajectory_states[0].shape[-1]),  # d of the states (layer, token, d)
        **(attrs or {}),
    }
    prompt_coords = {
        "prompt": [p.id for p in items],
        "prompt_source": ("prompt", [p.source for p in items]),
        "n_tokens": ("prompt", lengths),
    }
    jacobian_coords = {  # the prompts with Jacobians (the first ones)
        key: value[:n_jacobian_prompts]
        if isinstance(value, list)
        else (value[0], value[1][:n_jacobian_prompts])
        for key, value in prompt_coords.items()
    }
    depth_positions = depth_positions[:n_jacobian_prompts]
    paths = record.attrs(choice)
    return {
        "depth": depth_dataset(
            depth_results, jacobian_coords, depth_positions, config, {**common, **paths}
        )
        if depth_results
        else xr.Dataset(attrs=common),  # a shard of forward-only prompts (merge skips it)
        "spectra": spectra_dataset(depth_results, jacobian_coords, common)
        if depth_results
        else xr.Dataset(attrs=common),
        "tokens": tokens_dataset(
            token_results,
            list(items[:n_token_prompts]),
            family_tokens,
            token_layers,
            config,
            common,
        ),
        "trajectories": trajectory_dataset(trajectory_states, prompt_coords, config, common),
    }


_RENAMED = {"measure": extract, "measure_inputs": extract_inputs, "MeasureConfig": ExtractConfig}


def __getattr__(name: str) -> Any:
    """The names before the rename (extraction is ``extract``; a *measure* is a coupling
    measure of ``coupling.registry``), with a DeprecationWarning.
    """
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(
            f"{name} is renamed {new.__name__}; the old name will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return new
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
