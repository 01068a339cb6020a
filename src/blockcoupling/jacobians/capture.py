"""Record every block's real call in one forward pass, then re-invoke one block alone.

The forward pass runs with ``use_cache=False``: a KV cache left in the recorded kwargs would be
appended to on re-invocation, so the block would attend to every token twice (silently wrong
Jacobians on Llama-family blocks, a shape error on Falcon). The one deliberate exception,
``record_token_calls``, keeps a per-block snapshot of the prefix cache and copies the block's own
entry of it afresh on every re-invocation. Rotary embeddings, masks and ALiBi are whatever the
model passed to the block, so no per-architecture code is needed.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from blockcoupling.jacobians.adapters import blocks_of


@dataclass
class BlockCall:
    """One block's recorded call: ``block(*args, **kwargs)``; the hidden state sits at
    ``args[0]`` or ``kwargs['hidden_states']``. ``input``/``output``: ``(token, d)``.
    """

    block: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    input: torch.Tensor
    output: torch.Tensor


def _hidden_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"]
    raise TypeError("cannot find the block's hidden-state argument (args[0] or hidden_states=)")


def _output_tensor(output: Any) -> torch.Tensor:
    """Blocks return a Tensor (Llama in transformers 5) or a tuple whose first entry is it."""
    return output if isinstance(output, torch.Tensor) else output[0]


def tree_map(leaf: Callable[[Any], Any], value: Any) -> Any:
    """Apply ``leaf`` to every leaf of nested tuples, lists and dicts (other objects, a KV cache
    among them, are leaves), keeping the structure.
    """
    if isinstance(value, tuple):
        return tuple(tree_map(leaf, v) for v in value)
    if isinstance(value, list):
        return [tree_map(leaf, v) for v in value]
    if isinstance(value, dict):
        return {k: tree_map(leaf, v) for k, v in value.items()}
    return leaf(value)


def _detach(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def _check_no_cache(kwargs: dict[str, Any]) -> None:
    for name, value in kwargs.items():
        if _is_cache(value):
            raise RuntimeError(
                f"the recorded block call carries a KV cache in {name!r}; "
                "record with use_cache=False"
            )


def record_calls(model: nn.Module, **model_inputs: Any) -> list[BlockCall]:
    """Run one forward pass (no grad, ``use_cache=False``) and record every block's call.

    ``model_inputs`` are what the model takes, e.g. ``input_ids`` of shape ``(1, token)``.
    Returns L calls in depth order; batch size must be 1.
    """
    blocks = blocks_of(model)
    pending: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    calls: dict[int, BlockCall] = {}
    handles = []

    def pre_hook(index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            pending[index] = _snapshot(tree_map(_detach, (args, kwargs)), own_layer(module))

        return hook

    def post_hook(index: int) -> Callable[..., None]:
        def hook(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
        ) -> None:
            rec_args, rec_kwargs = pending.pop(index)
            hidden = _hidden_of(rec_args, rec_kwargs)
            if hidden.shape[0] != 1:
                raise ValueError(f"record_calls needs batch size 1, got {hidden.shape[0]}")
            device = block_device(module)  # a model spread over GPUs: the block's own
            calls[index] = BlockCall(
                module,
                rec_args,
                rec_kwargs,
                hidden[0].to(device),
                _output_tensor(output).detach()[0].to(device),
            )

        return hook

    for index, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(pre_hook(index), with_kwargs=True))
        handles.append(block.register_forward_hook(post_hook(index), with_kwargs=True))
    cached = "past_key_values" in model_inputs
    model_inputs = {**_one_logit(model), **model_inputs}
    try:
        with torch.no_grad():
            if cached:
                model(**model_inputs, use_cache=True)
            elif accepts_use_cache(model):
                model(**model_inputs, use_cache=False)
            else:
                model(**model_inputs)
    finally:
        for handle in handles:
            handle.remove()
    if len(calls) != len(blocks):
        raise RuntimeError(f"recorded {len(calls)} of {len(blocks)} block calls")
    if not cached:
        for call in calls.values():
            _check_no_cache(call.kwargs)
    return [calls[i] for i in range(len(blocks))]


def record_token_calls(model: nn.Module, input_ids: torch.Tensor, t: int) -> list[BlockCall]:
    """Every block's call on token ``t`` alone, with the KV cache of tokens ``< t`` as it stood
    when that block was called (its own entry copied then, so its append is not in it; the
    other blocks' entries are shared, and it never reads them).

    Re-invoking such a call (``residual_function`` copies the block's entry on every call, so
    nothing is appended twice) gives ``f(x)_t`` as a function of ``x_t`` alone, exactly the
    ``J_{tt}`` of a causal block at ~1/t of the full-sequence cost.
    ``input``/``output``: ``(1, d)``.
    """
    if t == 0:
        return record_calls(model, input_ids=input_ids[:, :1])
    with torch.no_grad():
        prefix = model(input_ids=input_ids[:, :t], use_cache=True, **_one_logit(model))
    return record_calls(
        model, input_ids=input_ids[:, t : t + 1], past_key_values=prefix.past_key_values
    )


def _one_logit(model: nn.Module) -> dict[str, Any]:
    """``{"logits_to_keep": 1}`` for a model whose forward takes it (transformers' causal LMs:
    the head then scores the last token only, a recording never reads the logits), else ``{}``.
    """
    forward = getattr(model, "forward", None)
    try:
        parameters = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}


def _snapshot(value: Any, layer: int | None = None) -> Any:
    """Copy any KV cache in a block's args or kwargs (the block will append to it): only the
    entry of ``layer`` (the block's own, the only one it appends to) when given and the cache
    keeps a list of per-layer entries, sharing the others; else the whole cache, deep.
    """
    return tree_map(lambda v: _copy_cache(v, layer) if _is_cache(v) else v, value)


def _copy_cache(cache: Any, layer: int | None) -> Any:
    entries = getattr(cache, "layers", None)
    if layer is None or not isinstance(entries, list) or not 0 <= layer < len(entries):
        return copy.deepcopy(cache)
    fresh = copy.copy(cache)
    fresh.layers = list(entries)
    fresh.layers[layer] = copy.deepcopy(entries[layer])
    return fresh


def own_layer(block: nn.Module) -> int | None:
    """The cache index a block's attention appends to (its modules' one ``layer_idx``), or None
    when it has none or several.
    """
    found = {
        value
        for module in block.modules()
        if isinstance(value := getattr(module, "layer_idx", None), int)
    }
    return found.pop() if len(found) == 1 else None


def accepts_use_cache(model: nn.Module) -> bool:
    """Whether the model takes ``use_cache`` (its text config has one: composite multimodal
    configs keep it in their text config).
    """
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return hasattr(text_config, "use_cache")


def states(calls: list[BlockCall]) -> torch.Tensor:
    """Token states through depth, ``(layer, token, d)`` for layer = 0..L: the first block's input,
    then every block's output (taken from the blocks, never from ``output_hidden_states``).
    """
    device = calls[0].input.device
    return torch.stack([calls[0].input] + [call.output.to(device) for call in calls])


def _cast(value: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """Floating tensors of a nested structure (KV caches included) in ``dtype`` on ``device``;
    other tensors on ``device``. A cache with a list of per-layer entries becomes a shallow
    copy whose entries are shallow copies holding the converted tensors (an entry already in
    ``dtype`` on ``device`` is shared: nothing writes to it, ``residual_function`` copies the
    block's own entry before each call); any other cache is copied deep.
    """

    def convert(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.to(device, dtype) if v.is_floating_point() else v.to(device)
        if _is_cache(v):
            entries = getattr(v, "layers", None)
            if not isinstance(entries, list):
                cache = copy.deepcopy(v)
                for layer in getattr(cache, "layers", ()):
                    _convert_entry(layer, convert)
                return cache
            cache = copy.copy(v)
            cache.layers = [_cast_entry(layer, convert) for layer in entries]
            return cache
        return v

    return tree_map(convert, value)


def _cast_entry(layer: Any, convert: Callable[[Any], Any]) -> Any:
    """``layer`` itself when converting changes none of its tensors, else a shallow copy with
    the converted tensors (the original untouched).
    """
    tensors = {name: t for name, t in vars(layer).items() if isinstance(t, torch.Tensor)}
    converted = {name: convert(t) for name, t in tensors.items()}
    if all(converted[name] is tensors[name] for name in tensors):
        return layer
    fresh = copy.copy(layer)
    for name, tensor in converted.items():
        setattr(fresh, name, tensor)
    return fresh


def _convert_entry(layer: Any, convert: Callable[[Any], Any]) -> None:
    for name, tensor in list(vars(layer).items()):
        if isinstance(tensor, torch.Tensor):
            setattr(layer, name, convert(tensor))


def _is_cache(value: Any) -> bool:
    from transformers.cache_utils import Cache

    return isinstance(value, Cache)


def block_device(block: nn.Module) -> torch.device:
    """Where a block's weights sit (each block of a model spread over GPUs has its own)."""
    parameter = next(block.parameters(), None)
    if parameter is None or parameter.device.type == "meta":
        raise ValueError(
            "the block's weights are not on a device (offloaded to disk or meta); load the model "
            "with its blocks on CPU or GPU (device_map without disk offload)"
        )
    return parameter.device


def compute_dtype(block: nn.Module) -> torch.dtype:
    """float64 for a float64 block (tests), float32 otherwise (half, bfloat16, quantized)."""
    floating = [p.dtype for p in block.parameters() if p.is_floating_point()]
    return (
        torch.float64 if floating and all(d == torch.float64 for d in floating) else torch.float32
    )


def compute_block(block: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``block`` itself when its weights are all ``dtype``; else a copy of this block alone in
    ``dtype`` on the same device, with bitsandbytes-quantized linear layers replaced by
    ``nn.Linear`` holding their dequantized weights (the Jacobian is that of the dequantized
    block, in ``dtype``).
    """
    parameters = list(block.parameters())
    if all(p.is_floating_point() and p.dtype == dtype for p in parameters):
        return block
    upcast = copy.deepcopy(block)
    for name, module in list(upcast.named_modules()):
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and not weight.is_floating_point():
            _replace(upcast, name, _dequantized_linear(module, dtype))
    return upcast.to(dtype)


def _dequantized_linear(module: nn.Module, dtype: torch.dtype) -> nn.Linear:
    """An ``nn.Linear`` equal to a bitsandbytes ``Linear4bit``/``Linear8bitLt`` (dequantized)."""
    from transformers.integrations.bitsandbytes import dequantize_bnb_weight

    weight = dequantize_bnb_weight(module.weight, getattr(module, "state", None)).to(dtype)
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=module.bias is not None)
    linear = linear.to(device=weight.device, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if module.bias is not None:
            linear.bias.copy_(module.bias)
    return linear


def _replace(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, module)


def residual_function(
    call: BlockCall, block: nn.Module | None = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``f(x) = block(x) - x`` for ``x`` of shape ``(token, d)``, re-invoking the block with its
    recorded arguments in the compute dtype on the block's own device. ``block``: the module to
    invoke, by default ``compute_block(call.block)`` (a float32 copy of this block alone when the
    model is in half precision or quantized; pass one to reuse it across calls).
    """
    dtype = compute_dtype(call.block)
    block = compute_block(call.block, dtype) if block is None else block
    device = block_device(call.block)
    args = _cast(call.args, dtype, device)
    kwargs = _cast(call.kwargs, dtype, device)
    in_kwargs = not (args and isinstance(args[0], torch.Tensor))
    layer = own_layer(call.block)

    def residual(x: torch.Tensor) -> torch.Tensor:
        hidden = x.unsqueeze(0)
        # a recorded KV-cache snapshot must not grow across calls
        fresh_args, fresh = _snapshot((args, kwargs), layer)
        if in_kwargs:
            out = block(*fresh_args, **{**fresh, "hidden_states": hidden})
        else:
            out = block(hidden, *fresh_args[1:], **fresh)
        return _output_tensor(out)[0].to(x.dtype) - x

    return residual
