"""What a recording and a re-invocation copy: the KV cache's entries are shared where nothing
converts them (a per-block deep copy of the whole cache made the depth path quadratic in the
number of blocks), converted copies leave the recorded cache untouched, and a recording's head
scores one token only.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import llama

from blockcoupling.jacobians.adapters import blocks_of
from blockcoupling.jacobians.capture import (
    _cast,
    record_calls,
    record_token_calls,
    residual_function,
)

IDS = torch.tensor([[1, 5, 9, 14, 3, 22, 7, 30]])  # inside tiny_models.VOCAB
LAST = IDS.shape[1] - 1


def cache_of(call) -> object:  # noqa: ANN001
    return call.kwargs["past_key_values"]


def test_a_cast_in_the_same_dtype_shares_every_cache_entry() -> None:
    calls = record_token_calls(llama(torch.float32), IDS, LAST)
    cache = cache_of(calls[1])
    cast = _cast(calls[1].kwargs, torch.float32, torch.device("cpu"))["past_key_values"]
    assert cast is not cache  # the block's own entry is replaced per call, never in the record
    assert all(a is b for a, b in zip(cast.layers, cache.layers, strict=True))


def test_a_cast_to_float32_converts_a_copy_and_leaves_the_recorded_cache_alone() -> None:
    calls = record_token_calls(llama(torch.bfloat16), IDS, LAST)
    cache = cache_of(calls[0])
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    cast = _cast(calls[0].kwargs, torch.float32, torch.device("cpu"))["past_key_values"]
    for layer, original, (keys, values) in zip(cast.layers, cache.layers, before, strict=True):
        assert layer is not original
        assert layer.keys.dtype == torch.float32 and layer.values.dtype == torch.float32
        torch.testing.assert_close(layer.keys, keys.float(), rtol=0, atol=0)
        assert original.keys.dtype == torch.bfloat16
        assert torch.equal(original.keys, keys) and torch.equal(original.values, values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_re_invoked_token_call_equals_the_full_pass_every_time(dtype: torch.dtype) -> None:
    """Re-invoking twice gives the same value (nothing appended to a shared entry), and it is
    the full pass's own output at token t (a reference inside a full forward)."""
    model = llama(dtype)
    full = record_calls(model, input_ids=IDS)
    calls = record_token_calls(model, IDS, LAST)
    for layer, (call, reference) in enumerate(zip(calls, full, strict=True)):
        residual = residual_function(call)
        x = reference.input[LAST : LAST + 1].to(torch.float32)
        with torch.no_grad():
            first, second = residual(x), residual(x)
        assert torch.equal(first, second), layer
        expected = (reference.output[LAST] - reference.input[LAST]).float()
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        assert float((first[0] - expected).norm() / expected.norm()) < tolerance, layer
        assert cache_of(call).layers[layer].keys.shape[-2] == LAST  # the record did not grow


def test_a_recording_scores_the_last_token_only() -> None:
    model = llama(torch.float32)
    rows = []
    handle = model.lm_head.register_forward_hook(lambda _m, args, _out: rows.append(args[0]))
    try:
        record_calls(model, input_ids=IDS)
        record_token_calls(model, IDS, LAST)
    finally:
        handle.remove()
    assert [r.shape[1] for r in rows] == [1, 1, 1]  # full pass, prefix, token call
    assert len(blocks_of(model)) == 3
