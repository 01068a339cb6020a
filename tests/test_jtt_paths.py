"""How each block's J_tt is taken, and never silently: the guards (like with like), the record of
methods and refusals, the stop on an accelerator, the timed choice and the watchdog."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
import transformers as hf
import xarray as xr
from finite_differences import block_jacobian
from tiny_models import ARCHITECTURES, CharTokenizer

from blockcoupling.jacobians import engine as engine_module
from blockcoupling.jacobians.adapters import blocks_of
from blockcoupling.jacobians.engine import (
    AUTOGRAD,
    COMPOSED,
    FULL_SEQUENCE,
    FullSequenceRefused,
    JacobianEngine,
    MethodChoice,
)
from blockcoupling.jacobians.extract import ExtractConfig, extract

IDS = torch.tensor([[5, 17, 3, 42, 8, 29, 11, 60, 2, 33, 7, 19]])
LAST = IDS.shape[1] - 1


@pytest.fixture(scope="module")
def bf16_gqa() -> torch.nn.Module:
    """A bfloat16 Llama with grouped key/value heads: width 64, 4 heads, 2 key-value heads."""
    config = hf.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=172,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        max_position_embeddings=64,
        attn_implementation="eager",
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return hf.LlamaForCausalLM(config).to(torch.bfloat16).eval()


def twin_reference(model: torch.nn.Module, layer: int, t: int) -> torch.Tensor:
    """``J_tt`` of block ``layer`` by central differences inside a full forward of a float32
    twin carrying the bfloat16 model's weights, its block fed the bfloat16 model's own input and
    position embeddings (independent of the engine's re-invocation)."""
    recorded = {}

    def record(_module, args, kwargs):  # noqa: ANN001
        recorded["x"] = (args[0] if args else kwargs["hidden_states"]).float()
        recorded["rope"] = tuple(p.float() for p in kwargs["position_embeddings"])

    handle = blocks_of(model)[layer - 1].register_forward_pre_hook(record, with_kwargs=True)
    with torch.no_grad():
        model(input_ids=IDS, use_cache=False)
    handle.remove()
    twin = hf.LlamaForCausalLM(model.config).eval()
    twin.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    block = blocks_of(twin)[layer - 1]

    def substitute(_module, args, kwargs):  # noqa: ANN001
        x = recorded["x"].expand(args[0].shape[0] if args else kwargs["hidden_states"].shape[0],
                                 -1, -1)  # fmt: skip
        kwargs = {**kwargs, "position_embeddings": recorded["rope"]}
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

    handle = block.register_forward_pre_hook(substitute, with_kwargs=True)
    try:
        with torch.no_grad():
            return block_jacobian(
                block, lambda inputs: twin(**inputs, use_cache=False), {"input_ids": IDS}, t, t,
                eps=1e-3,
            )  # fmt: skip
    finally:
        handle.remove()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_the_guard_accepts_a_right_composition_at_a_bfloat16_gqa_shape(bf16_gqa) -> None:
    """Every block composed, no refusal, and J_tt equals the float32 twin's finite differences
    inside a full forward up to the bfloat16 prefix cache."""
    engine = JacobianEngine(bf16_gqa, {"input_ids": IDS})
    for layer in (1, 2):
        jac = engine.diagonal(layer, LAST)
        assert relative(jac, twin_reference(bf16_gqa, layer, LAST)) < 2e-2
    assert engine.refused == []
    assert engine.methods == {(1, COMPOSED): 1, (2, COMPOSED): 1}


def test_the_guard_refuses_a_perturbed_composition_at_a_bfloat16_gqa_shape(
    bf16_gqa, monkeypatch
) -> None:
    """A composition off by 1e-3 (inside bfloat16's tolerance, which the old guard applied
    against a float32 full-sequence re-run) is refused against the re-invoked single-token block
    in float32; the block takes the single-token autograd path, and the refusal says by how
    much and against what tolerance."""
    right = engine_module.token_jacobian

    def perturbed(call, block, spec):  # noqa: ANN001, ANN202
        jac, value = right(call, block, spec)
        return jac * 1.001, value * 1.001

    monkeypatch.setattr(engine_module, "token_jacobian", perturbed)
    engine = JacobianEngine(bf16_gqa, {"input_ids": IDS})
    jac = engine.diagonal(2, LAST)
    assert engine.methods == {(2, AUTOGRAD): 1}
    (refusal,) = engine.refused
    assert (refusal.layer, refusal.t, refusal.path) == (2, LAST, "composition")
    assert refusal.difference == pytest.approx(1e-3, rel=1e-2) and refusal.tolerance == 1e-4
    assert "difference 1.00e-03 > tolerance 1.00e-04" in refusal.describe()
    assert relative(jac, twin_reference(bf16_gqa, 2, LAST)) < 2e-2


def raising_recording(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
    raise RuntimeError("the cache went missing")


def test_a_recording_that_raises_is_recorded_and_takes_the_full_sequence_on_cpu(
    monkeypatch,
) -> None:
    monkeypatch.setattr(engine_module, "record_token_calls", raising_recording)
    engine = JacobianEngine(ARCHITECTURES["llama"](torch.float32), {"input_ids": IDS[:, :6]})
    jac = engine.diagonal(2, 5)
    torch.testing.assert_close(jac, engine.output_token(2, 5)[5])
    assert engine.methods == {(2, FULL_SEQUENCE): 1}
    (refusal,) = engine.refused
    assert (refusal.layer, refusal.path, refusal.difference) == (2, "recording", None)
    assert refusal.reason == "RuntimeError: the cache went missing"


@pytest.mark.parametrize("cause", ["recording", "disagreement"])
def test_on_an_accelerator_the_full_sequence_needs_the_key(monkeypatch, cause) -> None:
    """Simulated accelerator: a refused block stops with one line naming the block, the reason
    (with the measured difference and tolerance for a disagreement) and the key; with the key
    set it takes the full-sequence path."""
    monkeypatch.setattr(engine_module, "is_accelerator", lambda device: True)
    if cause == "recording":
        monkeypatch.setattr(engine_module, "record_token_calls", raising_recording)
    model = ARCHITECTURES["llama"](torch.float32)
    for allowed in (False, True):
        engine = JacobianEngine(model, {"input_ids": IDS[:, :6]}, label="model m, prompt p",
                                allow_full_sequence=allowed)  # fmt: skip
        if cause == "disagreement":
            engine.full[1].input[4] += 1.0  # the full pass no longer matches the token call
        if not allowed:
            with pytest.raises(FullSequenceRefused) as stop:
                engine.diagonal(2, 4)
            message = str(stop.value)
            assert "\n" not in message and isinstance(stop.value, ValueError)
            assert message.startswith("model m, prompt p, block 2, token 4: ")
            assert "extract.allow_full_sequence" in message
            if cause == "recording":
                assert "recording: RuntimeError: the cache went missing" in message
            else:
                assert (
                    "single-token call: its value differs from the full pass (difference"
                    in (message)
                    and "> tolerance 1.00e-03" in message
                )
        else:
            engine.diagonal(2, 4)
            assert engine.methods == {(2, FULL_SEQUENCE): 1}


def test_measure_records_every_method_and_refusal_and_logs_one_line(monkeypatch, caplog) -> None:
    """The depth file's attrs hold each block's method and each refusal with its prompt; one
    log line per model gives the counts; on a simulated accelerator the job stops."""
    model = ARCHITECTURES["llama"](torch.float32)
    prompts = [{"id": "a", "text": "hello"}, {"id": "b", "text": "abc"}]
    config = ExtractConfig(k_max=2)
    with caplog.at_level(logging.INFO, logger="blockcoupling"):
        clean = extract(model, CharTokenizer(), prompts, config, progress=False)["depth"]
    assert json.loads(clean.attrs["jtt_methods"]) == {"1": {COMPOSED: 2}, "2": {COMPOSED: 2},
                                                      "3": {COMPOSED: 2}}  # fmt: skip
    assert json.loads(clean.attrs["jtt_refusals"]) == []
    assert clean.attrs["jtt_full_sequence"] == 0 and clean.attrs["jtt_composed"] == 6
    lines = [r.getMessage() for r in caplog.records if "J_tt by" in r.getMessage()]
    assert lines == ["the model: J_tt by composed 6, single-token autograd 0, full sequence 0; "
                     "0 refusals"]  # fmt: skip

    caplog.clear()
    monkeypatch.setattr(engine_module, "record_token_calls", raising_recording)
    with caplog.at_level(logging.INFO, logger="blockcoupling"):
        depth = extract(model, CharTokenizer(), prompts, config, progress=False)["depth"]
    assert json.loads(depth.attrs["jtt_methods"]) == {str(b): {FULL_SEQUENCE: 2} for b in (1, 2, 3)}
    refusals = json.loads(depth.attrs["jtt_refusals"])
    assert [(r["prompt"], r["layer"], r["path"]) for r in refusals] == [
        (p, b, "recording") for p in ("a", "b") for b in (1, 2, 3)
    ]
    assert depth.attrs["jtt_full_sequence"] == 6
    (line,) = [r for r in caplog.records if "J_tt by" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith(
        "the model: J_tt by composed 0, single-token autograd 0, full sequence 6; 6 refusals "
        "(commonest, 6x: recording: RuntimeError: the cache went missing"
    )

    monkeypatch.setattr(engine_module, "is_accelerator", lambda device: True)
    with pytest.raises(FullSequenceRefused, match="prompt a, block 1, token 4: .*recording"):
        extract(model, CharTokenizer(), prompts, config, progress=False)


@pytest.mark.parametrize(("margin", "chosen"), [(0.0, COMPOSED), (1e9, AUTOGRAD)])
def test_the_timed_choice_keeps_one_path_and_records_it(margin, chosen) -> None:
    """Both exact paths are timed on the first block (both recorded), one is kept for every later
    block; ``margin`` 0 never prefers autograd, 1e9 always does. Both give the same J_tt."""
    model = ARCHITECTURES["llama"](torch.float32)
    choice = MethodChoice(select=True, margin=margin)
    engine = JacobianEngine(model, {"input_ids": IDS[:, :6]}, choice=choice)
    reference = JacobianEngine(model, {"input_ids": IDS[:, :6]})
    for layer in (1, 2, 3):
        torch.testing.assert_close(
            engine.diagonal(layer, 5), reference.diagonal(layer, 5), rtol=1e-4, atol=1e-6
        )
    assert choice.method == chosen and set(choice.seconds) == {COMPOSED, AUTOGRAD}
    assert all(seconds > 0 for seconds in choice.seconds.values())
    assert engine.methods == {(layer, chosen): 1 for layer in (1, 2, 3)}
    later = JacobianEngine(model, {"input_ids": IDS[:, :6]}, choice=choice)  # the next prompt
    later.diagonal(1, 5)
    assert later.methods == {(1, chosen): 1}


def test_the_watchdog_logs_a_block_over_five_times_its_predicted_seconds(
    monkeypatch, caplog
) -> None:
    monkeypatch.setattr(engine_module, "WATCHDOG_FLOOR_S", 0.0)
    choice = MethodChoice(seconds_per_flop={COMPOSED: 1e-30})  # calibrated absurdly fast
    engine = JacobianEngine(ARCHITECTURES["llama"](torch.float32), {"input_ids": IDS[:, :6]},
                            label="model m, prompt p", choice=choice)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="blockcoupling"):
        engine.diagonal(2, 5)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("model m, prompt p, block 2: J_tt by composed took ")
    assert "over 5x its FLOP-predicted" in line and engine.slow == [line]


def test_a_shard_without_data_of_a_kind_still_counts_its_jtt_record() -> None:
    """The J_tt record counts a shard's depth Jacobians and rides on every kind of file; a shard
    whose token file is empty (token families on the first prompts only), or which records no
    count, was left out of the sum: the workflow's merged files said 4 where one job said 10."""
    from blockcoupling.jacobians.datasets import merge_shards

    def shard(n: int, count: int | None) -> xr.Dataset:
        data = xr.Dataset(
            {"x": (("prompt",), np.arange(n, dtype=float))},
            coords={"prompt": [f"p{i}" for i in range(n)]},
        )
        if count is not None:
            data.attrs.update(
                jtt_autograd=count,
                jtt_methods=json.dumps({"1": {"single-token autograd": count}}),
                jtt_refusals="[]",
                jtt_choice="composed",
            )
        return data

    empty = shard(0, 2).drop_vars("x")
    merged = merge_shards([shard(2, 4), shard(3, 6), empty, shard(1, None)])
    assert merged.attrs["jtt_autograd"] == 12
    assert json.loads(merged.attrs["jtt_methods"]) == {"1": {"single-token autograd": 12}}
    assert merged.attrs["jtt_choice"] == "composed"
