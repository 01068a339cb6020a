"""Jacobians of half-precision and bitsandbytes-quantized models: float32, one block at a time."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import transformers
from tiny_models import llama

from blockcoupling.jacobians.adapters import blocks_of
from blockcoupling.jacobians.capture import compute_block
from blockcoupling.jacobians.engine import JacobianEngine
from blockcoupling.lm.models import LoadOptions, _quantization_config

IDS = torch.tensor([[5, 17, 3, 42, 8, 29]])


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_a_bfloat16_model_takes_the_single_token_path_in_float32() -> None:
    """The prefix KV cache of a bf16 model is cast with the float32 copy of the block, so the
    single-token path holds (no fallback) and agrees with the full-sequence path up to the
    half-precision cache (measured ~1e-4)."""
    model = llama(torch.bfloat16)
    engine = JacobianEngine(model, {"input_ids": IDS})
    for layer in (1, 3):
        fast = engine.diagonal(layer, 4)
        assert fast.dtype == torch.float32
        assert relative_error(fast, engine.output_token(layer, 4)[4]) < 1e-3
    assert engine.fallbacks == 0
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # the model is untouched


bnb_missing = importlib.util.find_spec("bitsandbytes") is None


@pytest.mark.skipif(bnb_missing, reason="bitsandbytes is not installed")
@pytest.mark.parametrize(
    "load",
    [
        {"quantization": "4bit"},  # the default: nf4, double quantization, float32 compute
        {"quantization": "4bit", "quant_type": "fp4", "double_quant": False},
        {"quantization": "8bit"},
    ],
    ids=["4bit-nf4-double", "4bit-fp4", "8bit"],
)
def test_quantized_blocks_are_dequantized_one_at_a_time(tmp_path, load: dict) -> None:
    """The Jacobian of a bitsandbytes model loaded with the library's settings equals that of
    the same model dequantized by transformers (an independent path), computed in float64."""
    transformers.LlamaForCausalLM(  # bitsandbytes' CPU kernels need widths of 64 and more
        transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=32,
        )
    ).save_pretrained(tmp_path)
    config = _quantization_config(LoadOptions(**load))

    def load() -> torch.nn.Module:
        return transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, quantization_config=config, device_map="cpu", attn_implementation="eager"
        ).eval()

    quantized = load()
    block = blocks_of(quantized)[0]
    upcast = compute_block(block, torch.float32)
    assert upcast is not block and not any(
        type(m).__module__.startswith("bitsandbytes") for m in upcast.modules()
    )
    assert any(type(m).__module__.startswith("bitsandbytes") for m in block.modules())
    from transformers.integrations.bitsandbytes import dequantize_bnb_weight

    # block 1: its input (the embeddings) is the same in both models, so the Jacobians are
    # taken at the same point (later blocks see the quantized model's own activations). The
    # reference: the float checkpoint in float64 with each quantized layer's dequantized weight
    # (bitsandbytes' CPU 4-bit layout defeats transformers' own model.dequantize()).
    got = JacobianEngine(quantized, {"input_ids": IDS}).output_token(1, 4)
    reference_model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float64, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        for name, module in quantized.named_modules():
            if type(module).__module__.startswith("bitsandbytes"):
                weight = dequantize_bnb_weight(module.weight, getattr(module, "state", None))
                reference_model.get_submodule(name).weight.copy_(weight.double())
    reference = JacobianEngine(reference_model, {"input_ids": IDS}).output_token(1, 4)
    assert relative_error(got, reference) < 1e-5
