"""Tiny random models of several architectures, and a float64-exact harness for them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import transformers

VOCAB = 64


def _build(config: transformers.PretrainedConfig, cls: type, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    model = cls(config).to(dtype).eval()
    return model


def llama(dtype: torch.dtype = torch.float64, layers: int = 3) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    return _build(config, transformers.LlamaForCausalLM, dtype)


def gpt_neox(dtype: torch.dtype = torch.float64, layers: int = 3) -> torch.nn.Module:
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=32,
        rotary_pct=0.5,
        attn_implementation="eager",
    )
    return _build(config, transformers.GPTNeoXForCausalLM, dtype)


def gpt2(dtype: torch.dtype = torch.float64, layers: int = 3) -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=16,
        n_layer=layers,
        n_head=4,
        n_positions=32,
        attn_implementation="eager",
    )
    return _build(config, transformers.GPT2LMHeadModel, dtype)


def falcon(dtype: torch.dtype = torch.float64, layers: int = 3) -> torch.nn.Module:
    config = transformers.FalconConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=4,
        new_decoder_architecture=False,
        multi_query=True,
        parallel_attn=True,
        alibi=False,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    return _build(config, transformers.FalconForCausalLM, dtype)


def opt(dtype: torch.dtype = torch.float64, layers: int = 3) -> torch.nn.Module:
    config = transformers.OPTConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        ffn_dim=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=32,
        word_embed_proj_dim=16,
        attn_implementation="eager",
    )
    return _build(config, transformers.OPTForCausalLM, dtype)


ARCHITECTURES: dict[str, Callable[..., torch.nn.Module]] = {
    "llama": llama,
    "gpt_neox": gpt_neox,
    "gpt2": gpt2,
    "falcon": falcon,
    "opt": opt,
}


class CharTokenizer:
    """A stand-in tokenizer: one token per character (ids mod the vocabulary)."""

    def __call__(self, text: str, return_tensors: str | None = None) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([[ord(c) % VOCAB for c in text]])}


@contextlib.contextmanager
def float64_exact() -> Iterator[None]:
    """Make HF's float32 islands (softmax(dtype=float32), Llama RMSNorm's upcast) respect float64,
    so that finite differences can reach 1e-6 relative error. Harness only: the library is
    untouched."""
    softmax = torch.nn.functional.softmax

    def softmax64(input, dim=None, _stacklevel=3, dtype=None):  # noqa: ANN001
        if input.dtype == torch.float64:
            dtype = None
        return softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    def rms_forward(self, hidden_states):  # noqa: ANN001
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    norm = transformers.models.llama.modeling_llama.LlamaRMSNorm
    original = norm.forward
    torch.nn.functional.softmax = softmax64
    norm.forward = rms_forward
    try:
        yield
    finally:
        torch.nn.functional.softmax = softmax
        norm.forward = original
