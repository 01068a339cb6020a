"""Block Jacobians against finite differences inside a full forward, and a naive autograd loop."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from finite_differences import block_jacobian
from tiny_models import ARCHITECTURES, DEVICE, IMAGE_ARCHITECTURES, IMAGE_SIZE, float64_exact

from blockcoupling.jacobians.adapters import ADAPTERS, blocks_of
from blockcoupling.jacobians.capture import record_calls, residual_function
from blockcoupling.jacobians.engine import JacobianEngine, Request

N_TOKENS = 6
IDS = torch.tensor([[5, 17, 3, 42, 8, 29]])
PIXELS = torch.randn(
    1, 3, IMAGE_SIZE, IMAGE_SIZE, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
)
EVERY_ARCHITECTURE = sorted(ARCHITECTURES) + sorted(IMAGE_ARCHITECTURES)
CAUSAL_TEXT = [arch for arch in sorted(ARCHITECTURES) if ADAPTERS[arch].causal]
# Blocks that torch.func refuses, so the engine takes its plain autograd loops (and why).
NEEDS_AUTOGRAD_LOOPS = {"bloom": "BloomGelu is a custom autograd.Function without setup_context"}


def tiny(arch: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A tiny float64 model of ``arch`` and its batch-1 inputs (6 token ids or one image), on
    ``DEVICE``."""
    if arch in IMAGE_ARCHITECTURES:
        return IMAGE_ARCHITECTURES[arch]().to(DEVICE), {"pixel_values": PIXELS.to(DEVICE)}
    return ARCHITECTURES[arch]().to(DEVICE), {"input_ids": IDS.to(DEVICE)}


def run_model(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    """One forward pass without a KV cache."""
    text_config = model.config.get_text_config()
    with torch.no_grad():
        if hasattr(text_config, "use_cache"):
            model(**inputs, use_cache=False)
        else:
            model(**inputs)


def fd_jacobian(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], layer: int, t1: int, t2: int
) -> torch.Tensor:
    """Central differences of block ``layer``'s residual (``finite_differences``)."""
    block = blocks_of(model)[layer - 1]
    return block_jacobian(block, lambda batch: run_model(model, batch), inputs, t1, t2)


def naive_jacobian(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], layer: int, t1: int, t2: int
) -> torch.Tensor:
    """One autograd row at a time through the full-length re-invocation (no prefix, no vmap)."""
    call = record_calls(model, **inputs)[layer - 1]
    f = residual_function(call)
    x = call.input.clone().requires_grad_(True)
    y = f(x)[t2]
    rows = [torch.autograd.grad(y[i], x, retain_graph=True)[0][t1] for i in range(y.shape[0])]
    return torch.stack(rows)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def requests_for(engine: JacobianEngine) -> list[Request]:
    """Diagonal and context Jacobians in every layer; input after output for encoders."""
    last = engine.n_tokens - 1
    wanted = [
        Request(2, 4, 4),
        Request(2, 1, 4),
        Request(3, 0, last),
        Request(1, last, last),
        Request(1, 0, 0),
    ]
    if not engine.causal:
        wanted.append(Request(2, 4, 1))
    return wanted


def outside_sliding_window(model: torch.nn.Module, request: Request) -> bool:
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    return window is not None and request.t2 - request.t1 >= window


@pytest.mark.parametrize("arch", EVERY_ARCHITECTURE)
def test_every_jacobian_kind_matches_finite_differences(arch: str) -> None:
    """Every architecture of the adapter table: batched VJPs (``jacobians``), JVPs
    (``input_token``) and a naive autograd loop against central differences in float64."""
    with float64_exact():
        model, inputs = tiny(arch)
        engine = JacobianEngine(model, inputs)
        wanted = requests_for(engine)
        got = engine.jacobians(wanted)
        for request in wanted:
            fd = fd_jacobian(model, inputs, request.layer, request.t1, request.t2)
            forward = engine.input_token(request.layer, request.t1)[request.t2]  # JVPs
            if torch.count_nonzero(fd) == 0:  # a sliding-window mask: exactly zero, both ways
                assert outside_sliding_window(model, request), f"{arch} {request}: J is 0"
                assert torch.count_nonzero(got[request]) == torch.count_nonzero(forward) == 0
                continue
            assert fd.norm() > 1e-3, f"{arch} {request}: reference Jacobian is ~0"
            assert relative_error(got[request], fd) < 1e-6, f"{arch} {request}"
            naive = naive_jacobian(model, inputs, request.layer, request.t1, request.t2)
            assert relative_error(got[request], naive) < 1e-10, f"{arch} {request}"
            assert relative_error(forward, fd) < 1e-6, f"{arch} {request} (JVP)"
        assert (engine.loop_fallbacks > 0) == (arch in NEEDS_AUTOGRAD_LOOPS), engine.loop_fallbacks


@pytest.mark.parametrize("arch", CAUSAL_TEXT)
def test_context_jacobians_are_nonzero_and_causal_prefix_only(arch: str) -> None:
    model = ARCHITECTURES[arch]()
    engine = JacobianEngine(model, {"input_ids": IDS})
    jac = engine.output_token(2, 3)
    assert jac.shape[0] == 4, "only t1 <= t2 is computed (prefix re-invocation)"
    for t1 in range(3):
        assert jac[t1].abs().max() > 1e-4, f"context Jacobian J_{t1},3 is zero"


def test_recording_with_a_kv_cache_would_be_wrong() -> None:
    """The pitfall the recorder guards against: a block call recorded with the KV cache on holds a
    cache that already has the block's keys of every token, so the re-invoked block attends twice
    (its cached keys and the re-computed ones). As recorded, the mask covers the tokens once and
    the call fails; with a mask over both, it runs and its Jacobian is not the FD reference (which
    perturbs the block input inside a full forward). Either way the claim is checked; the
    recorder's own calls hold no cache and match FD.
    """
    model = ARCHITECTURES["llama"]()
    layer, t1, t2 = 2, 1, 4
    with float64_exact():
        reference = fd_jacobian(model, {"input_ids": IDS}, layer, t1, t2)
        good = naive_jacobian(model, {"input_ids": IDS}, layer, t1, t2)
    assert relative_error(good, reference) < 1e-6
    calls = record_calls(model, input_ids=IDS)
    assert all(call.kwargs.get("past_key_values") is None for call in calls)

    block, captured = blocks_of(model)[layer - 1], {}

    def pre(module, args, kwargs):  # noqa: ANN001
        captured.update(args=args, kwargs=dict(kwargs))

    handle = block.register_forward_pre_hook(pre, with_kwargs=True)
    with torch.no_grad():
        model(input_ids=IDS, use_cache=True)
    handle.remove()
    recorded = copy.deepcopy(captured["kwargs"])  # as the forward left it (re-invocation appends)
    assert recorded["past_key_values"].get_seq_length(layer - 1) == N_TOKENS  # cached already
    x = captured["args"][0][0] if captured["args"] else recorded.pop("hidden_states")[0]

    def cached_residual(x: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """``block(x) - x`` re-invoked with the recorded kwargs (a fresh copy of the cache)."""
        out = block(x.unsqueeze(0), **copy.deepcopy(kwargs))
        return (out if isinstance(out, torch.Tensor) else out[0])[0] - x

    kwargs = recorded
    try:
        with torch.no_grad():
            cached_residual(x, kwargs)
    except RuntimeError as error:  # the scores span 2n keys, the recorded mask n
        assert f"({2 * N_TOKENS})" in str(error), error
        mask = kwargs["attention_mask"]
        assert mask.shape[-1] == N_TOKENS
        seen = torch.ones_like(mask) if mask.dtype == torch.bool else torch.zeros_like(mask)
        kwargs = {**kwargs, "attention_mask": torch.cat([seen, mask], dim=-1)}  # cached: visible
    with torch.no_grad():
        doubled = copy.deepcopy(kwargs)
        block(x.unsqueeze(0), **doubled)
        assert doubled["past_key_values"].get_seq_length(layer - 1) == 2 * N_TOKENS
    full = torch.autograd.functional.jacobian(lambda v: cached_residual(v, kwargs)[t2], x)
    bad = full[:, t1, :]
    assert torch.isfinite(bad).all() and relative_error(bad, reference) > 1e-2


def test_a_cache_in_recorded_kwargs_is_refused() -> None:
    from transformers.cache_utils import DynamicCache

    from blockcoupling.jacobians.capture import _check_no_cache

    with pytest.raises(RuntimeError, match="use_cache=False"):
        _check_no_cache({"past_key_values": DynamicCache()})


def test_bad_requests_get_one_clear_error() -> None:
    engine = JacobianEngine(ARCHITECTURES["gpt2"](), {"input_ids": IDS})
    with pytest.raises(ValueError, match="t1=4 > t2=2"):
        engine.jacobians([Request(1, 4, 2)])
    with pytest.raises(ValueError, match="layer 9 is outside 1..3"):
        engine.jacobians([Request(9, 0, 0)])
    with pytest.raises(ValueError, match="outside the prompt's tokens"):
        engine.jacobians([Request(1, 0, 6)])


def test_half_precision_model_is_differentiated_in_float32() -> None:
    model = ARCHITECTURES["llama"](dtype=torch.bfloat16)
    jac = JacobianEngine(model, {"input_ids": IDS}).output_token(2, 5)
    assert jac.dtype == torch.float32
    assert torch.isfinite(jac).all()
    reference = JacobianEngine(
        ARCHITECTURES["llama"](dtype=torch.bfloat16).float(), {"input_ids": IDS}
    ).output_token(2, 5)
    assert relative_error(jac, reference) < 0.05  # bf16 inputs/weights, float32 arithmetic


def test_non_finite_jacobian_names_layer_and_tokens() -> None:
    from blockcoupling.jacobians.engine import NonFiniteJacobianError

    model = ARCHITECTURES["gpt2"]()
    with torch.no_grad():
        blocks_of(model)[1].mlp.c_fc.weight[0, 0] = float("nan")
    engine = JacobianEngine(model, {"input_ids": IDS})
    with pytest.raises(NonFiniteJacobianError, match="layer 2, t2=3"):
        engine.output_token(2, 3)


@pytest.mark.parametrize("arch", CAUSAL_TEXT)
def test_single_token_diagonal_path_matches_finite_differences(arch: str) -> None:
    """J_tt through a snapshot of the prefix KV cache equals the FD reference and the
    full-sequence path, and never falls back on these architectures."""
    with float64_exact():
        model, inputs = tiny(arch)
        engine = JacobianEngine(model, inputs)
        for layer, t in ((1, 5), (2, 3), (3, 0)):
            fast = engine.diagonal(layer, t)
            assert relative_error(fast, fd_jacobian(model, inputs, layer, t, t)) < 1e-6, (
                f"{arch} layer {layer} t {t}"
            )
            assert relative_error(fast, engine.output_token(layer, t)[t]) < 1e-10
            again = engine.diagonal(layer, t)  # the cache snapshot does not grow across calls
            assert torch.equal(fast, again)
        assert engine.fallbacks == 0
        composed = ADAPTERS[arch].token_jacobian is not None
        assert (engine.composed, engine.not_composed) == ((6, 0) if composed else (0, 6))


@pytest.mark.parametrize("arch", [a for a in CAUSAL_TEXT if ADAPTERS[a].token_jacobian])
def test_composed_diagonal_equals_the_autograd_single_token_path(arch: str) -> None:
    """J_tt composed from the weights (``token_jacobian``) equals autograd through the
    re-invoked single-token block at every layer and token, to rounding in float64."""
    with float64_exact():
        model, inputs = tiny(arch)
        engine, autograd = JacobianEngine(model, inputs), JacobianEngine(model, inputs)
        autograd._composed = lambda layer, t: None  # the path of architectures without one
        for layer, t in itertools.product(range(1, 4), range(N_TOKENS)):
            assert relative_error(engine.diagonal(layer, t), autograd.diagonal(layer, t)) < 1e-12
        assert engine.composed == 3 * N_TOKENS and autograd.not_composed == 3 * N_TOKENS


def test_diagonal_falls_back_when_the_cached_call_disagrees() -> None:
    model = ARCHITECTURES["llama"]()
    engine = JacobianEngine(model, {"input_ids": IDS})
    engine.full[1].input[4] += 1.0  # corrupt the reference: the guard must refuse the fast path
    jac = engine.diagonal(2, 4)
    assert engine.fallbacks == 1
    assert torch.isfinite(jac).all()
    # the single-token call is refused, and with it both single-token paths, saying why
    assert engine.refusals == {"single-token call: its value differs from the full pass": 1}
    (refusal,) = engine.refused
    assert refusal.difference > refusal.tolerance == 1e-8


def test_input_token_jacobians_equal_output_token_ones_and_the_fallback() -> None:
    """J_{t1 t} for every output token t from one JVP batch at t1 equals the VJP path's blocks
    (zero for t < t1: causality), and the double-backward fallback gives the same columns."""
    from blockcoupling.jacobians.engine import _products_by_double_backward

    with float64_exact():
        model = ARCHITECTURES["llama"]()
        engine = JacobianEngine(model, {"input_ids": IDS})
        for t1 in (1, 3):
            forward = engine.input_token(2, t1)  # (t2, d, d)
            assert forward.shape == (N_TOKENS, 16, 16)
            for t2 in range(t1, N_TOKENS):
                torch.testing.assert_close(
                    forward[t2], engine.output_token(2, t2)[t1], rtol=1e-10, atol=1e-12
                )
            assert torch.count_nonzero(forward[:t1]) == 0
        call = engine.full[1]
        tangents = torch.zeros(3, N_TOKENS, 16, dtype=torch.float64)
        tangents[:, 3] = torch.eye(16, dtype=torch.float64)[:3]
        fallback = _products_by_double_backward(residual_function(call), call.input, tangents)
        torch.testing.assert_close(
            fallback.permute(1, 2, 0), engine.input_token(2, 3)[..., :3], rtol=1e-10, atol=1e-12
        )


class OldStyleTanh(torch.autograd.Function):
    """tanh with a hand-written backward and no ``setup_context`` (as BLOOM's GeLU):
    ``torch.func`` refuses it, plain autograd (and double backward) accepts it."""

    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


def test_blocks_that_torch_func_refuses_fall_back_to_autograd_loops() -> None:
    """A token-mixing block whose nonlinearity is a custom autograd.Function: the VJP loop and the
    double-backward JVPs equal the vmapped paths on the same block built from torch.tanh, and
    each fallback is reported once per batch."""
    from blockcoupling.jacobians.engine import input_token_jacobians, output_token_jacobians

    generator = torch.Generator().manual_seed(0)
    mixing = torch.randn(N_TOKENS, N_TOKENS, generator=generator, dtype=torch.float64).tril()
    weight = torch.randn(16, 16, generator=generator, dtype=torch.float64) / 4
    x = torch.randn(N_TOKENS, 16, generator=generator, dtype=torch.float64)

    def block(activation):  # noqa: ANN001, ANN202
        return lambda h: activation((mixing @ h) @ weight.T)

    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.vjp(block(OldStyleTanh.apply), x)
    refused: list[str] = []
    accepted: list[str] = []
    for t in (0, 3, 5):
        loop = output_token_jacobians(
            block(OldStyleTanh.apply), x, t, on_fallback=lambda: refused.append("vjp")
        )
        vmapped = output_token_jacobians(
            block(torch.tanh), x, t, on_fallback=lambda: accepted.append("vjp")
        )
        torch.testing.assert_close(loop, vmapped, rtol=1e-12, atol=1e-14)
        assert torch.count_nonzero(loop[: t + 1]) > 0
        columns = input_token_jacobians(
            block(OldStyleTanh.apply), x, t, on_fallback=lambda: refused.append("jvp")
        )
        forward = input_token_jacobians(
            block(torch.tanh), x, t, on_fallback=lambda: accepted.append("jvp")
        )
        torch.testing.assert_close(columns, forward, rtol=1e-12, atol=1e-14)
    assert refused == ["vjp", "jvp"] * 3
    assert accepted == []


def test_auto_chunk_bounds_memory_everywhere_and_cache_traffic_on_cpu() -> None:
    """GPU batches are as large as 1 GiB of activations allows (all d when they fit); CPU
    batches keep one (token, d) gradient under 4 MiB, but never below max(64, d / 8)."""
    from blockcoupling.jacobians.options import AUTO_CHUNK_BYTES, AUTO_CHUNK_CPU_BYTES, auto_chunk

    assert auto_chunk(26, 576) == 576
    assert auto_chunk(64, 4096) == AUTO_CHUNK_BYTES // (8 * 64 * 4096 * 4) == 128
    assert auto_chunk(10, 576, cpu=True) == AUTO_CHUNK_CPU_BYTES // (10 * 576 * 4) == 182
    assert auto_chunk(64, 576, cpu=True) == 72  # the floor d / 8 (113 KiB a sample)
    assert auto_chunk(26, 2048, cpu=True) == 256  # the floor d / 8
    assert auto_chunk(26, 4096, cpu=True) == auto_chunk(26, 4096) == 315  # memory first
    assert auto_chunk(3, 16, cpu=True) == 16  # never more than d
    assert auto_chunk(100_000, 8192) == 1


def test_chunked_vjp_batches_give_the_same_jacobians() -> None:
    with float64_exact():
        model, inputs = tiny("llama")
        whole, chunked = JacobianEngine(model, inputs), JacobianEngine(model, inputs, chunk_size=5)
        assert relative_error(chunked.diagonal(2, 4), whole.diagonal(2, 4)) < 1e-12
        assert relative_error(chunked.output_token(1, 5), whole.output_token(1, 5)) < 1e-12
        assert relative_error(chunked.input_token(3, 1), whole.input_token(3, 1)) < 1e-12


def test_a_block_call_copies_only_its_own_cache_entry() -> None:
    """Re-invoking block l copies cache entry l (it appends there) and shares the others; with
    no layer index (a block with none or several) the whole cache is copied."""
    from transformers import DynamicCache

    from blockcoupling.jacobians.capture import _snapshot, own_layer

    model = ARCHITECTURES["llama"]()
    with torch.no_grad():
        cache = model(input_ids=IDS[:, :4], use_cache=True).past_key_values
    block = blocks_of(model)[1]
    assert own_layer(block) == 1 and own_layer(torch.nn.Linear(2, 2)) is None
    (copied,) = _snapshot((cache,), own_layer(block))
    assert copied.layers[1] is not cache.layers[1] and copied.layers[0] is cache.layers[0]
    copied.update(torch.zeros_like(cache.layers[1].keys[..., :1, :]),
                  torch.zeros_like(cache.layers[1].values[..., :1, :]), 1)  # fmt: skip
    assert cache.layers[1].keys.shape[-2] == 4 and copied.layers[1].keys.shape[-2] == 5
    (whole,) = _snapshot((cache,))
    assert all(a is not b for a, b in zip(whole.layers, cache.layers))
    assert isinstance(whole, DynamicCache)
