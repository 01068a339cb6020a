"""Tiny random models of every architecture of the adapter table, and a float64-exact harness.

Text models (``ARCHITECTURES``) take ``input_ids`` below ``VOCAB``; image models
(``IMAGE_ARCHITECTURES``) take ``pixel_values`` of shape ``(1, 3, IMAGE_SIZE, IMAGE_SIZE)``.
Every builder takes ``dtype`` and ``layers`` and returns a seeded model in eval mode with eager
attention: hidden size 16, 4 heads (2 key-value heads where the architecture has them), MLP 32.
``DEVICE`` is where the device-aware tests put them: ``cpu``, or ``BLOCKCOUPLING_TEST_DEVICE``
(e.g. ``cuda``: ``BLOCKCOUPLING_TEST_DEVICE=cuda pytest tests/test_jacobians.py`` on a GPU).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import transformers as hf

VOCAB = 64
DEVICE = torch.device(os.environ.get("BLOCKCOUPLING_TEST_DEVICE", "cpu"))
IMAGE_SIZE = 8  # 2 x 2 patches of 4 x 4 pixels
Builder = Callable[..., torch.nn.Module]


def _build(config: hf.PretrainedConfig, cls: type, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    model = cls(config).to(dtype).eval()
    return model


def _tiny(model_cls: type, layers_key: str = "num_hidden_layers", **fixed: Any) -> Builder:
    """A builder ``(dtype=float64, layers=3) -> model`` of ``model_cls`` with its config class
    given ``fixed`` and ``layers`` (under ``layers_key``), named after its ``model_type``.
    """
    config_cls = model_cls.config_class

    def build(dtype: torch.dtype = torch.float64, layers: int = 3) -> torch.nn.Module:
        config = config_cls(**fixed, **{layers_key: layers}, attn_implementation="eager")
        return _build(config, model_cls, dtype)

    build.__name__ = config_cls.model_type
    return build


SPECIAL_IDS = dict(bos_token_id=1, eos_token_id=2)  # inside VOCAB (GPT-2-like defaults: 50256)
# Llama-like decoders: RMSNorm, rotary embeddings, grouped-query attention.
DECODER = dict(
    SPECIAL_IDS,
    vocab_size=VOCAB,
    hidden_size=16,
    intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    pad_token_id=None,
)
# Gemma 2/3: sliding-window layers (window 4 < the 6 test tokens), head_dim set explicitly.
GEMMA = dict(DECODER, head_dim=4, query_pre_attn_scalar=4, sliding_window=4)
ENCODER = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    intermediate_size=32,
    num_attention_heads=4,
    max_position_embeddings=32,
)
VISION = dict(
    hidden_size=16,
    intermediate_size=32,
    num_attention_heads=4,
    image_size=IMAGE_SIZE,
    patch_size=4,
    num_channels=3,
)

llama = _tiny(hf.LlamaForCausalLM, **DECODER)
mistral = _tiny(hf.MistralForCausalLM, **dict(DECODER, sliding_window=4))
mixtral = _tiny(
    hf.MixtralForCausalLM,
    **DECODER,
    num_local_experts=4,
    num_experts_per_tok=2,
    experts_implementation="eager",  # as blockcoupling.lm.models loads them
)
qwen2 = _tiny(hf.Qwen2ForCausalLM, **DECODER)
qwen3 = _tiny(hf.Qwen3ForCausalLM, **DECODER, head_dim=4)
gemma = _tiny(hf.GemmaForCausalLM, **DECODER, head_dim=4)
gemma2 = _tiny(
    hf.Gemma2ForCausalLM, **GEMMA, attn_logit_softcapping=2.0, final_logit_softcapping=5.0
)
gemma3_text = _tiny(hf.Gemma3ForCausalLM, **GEMMA)
olmo = _tiny(hf.OlmoForCausalLM, **DECODER)
olmo2 = _tiny(hf.Olmo2ForCausalLM, **DECODER)
phi = _tiny(hf.PhiForCausalLM, **DECODER, partial_rotary_factor=0.5)
phi3 = _tiny(hf.Phi3ForCausalLM, **DECODER)
stablelm = _tiny(hf.StableLmForCausalLM, **DECODER, partial_rotary_factor=0.5)
gpt_neox = _tiny(
    hf.GPTNeoXForCausalLM,
    vocab_size=VOCAB,
    hidden_size=16,
    intermediate_size=32,
    num_attention_heads=4,
    max_position_embeddings=32,
    rotary_pct=0.5,
)
gpt2 = _tiny(
    hf.GPT2LMHeadModel,
    "n_layer",
    **SPECIAL_IDS,
    vocab_size=VOCAB,
    n_embd=16,
    n_head=4,
    n_positions=32,
)
gptj = _tiny(
    hf.GPTJForCausalLM,
    "n_layer",
    **SPECIAL_IDS,
    vocab_size=VOCAB,
    n_embd=16,
    n_head=4,
    n_positions=32,
    rotary_dim=2,
)
falcon = _tiny(
    hf.FalconForCausalLM,
    vocab_size=VOCAB,
    hidden_size=16,
    num_attention_heads=4,
    new_decoder_architecture=False,
    multi_query=True,
    parallel_attn=True,
    alibi=False,
    max_position_embeddings=32,
)
bloom = _tiny(
    hf.BloomForCausalLM, "n_layer", **SPECIAL_IDS, vocab_size=VOCAB, hidden_size=16, n_head=4
)
mpt = _tiny(
    hf.MptForCausalLM,
    "n_layers",
    vocab_size=VOCAB,
    d_model=16,
    n_heads=4,
    expansion_ratio=2,
    max_seq_len=32,
)
opt = _tiny(
    hf.OPTForCausalLM,
    vocab_size=VOCAB,
    hidden_size=16,
    ffn_dim=32,
    num_attention_heads=4,
    max_position_embeddings=32,
    word_embed_proj_dim=16,
)
bert = _tiny(hf.BertModel, **ENCODER)
roberta = _tiny(hf.RobertaModel, **ENCODER)
vit = _tiny(hf.ViTModel, **VISION)
_deit = _tiny(hf.DeiTModel, **VISION)


def deit(dtype: torch.dtype = torch.float64, layers: int = 3) -> torch.nn.Module:
    """DeiT with its class, distillation and position embeddings drawn like ViT's: DeiT
    initialises them to zero, which puts the first block's LayerNorm (eps 1e-12) at its singular
    point for the class tokens (a degenerate place to compare derivatives).
    """
    model = _deit(dtype, layers)
    embeddings = model.embeddings
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for weight in (
            embeddings.cls_token,
            embeddings.distillation_token,
            embeddings.position_embeddings,
        ):
            weight.copy_(0.02 * torch.randn(weight.shape, generator=generator))
    return model


def gpt_neo(dtype: torch.dtype = torch.float64, layers: int = 3) -> torch.nn.Module:
    """GPT-Neo alternating global and local (window 4) attention."""
    kinds = (["global", "local"] * layers)[:layers]
    config = hf.GPTNeoConfig(
        **SPECIAL_IDS,
        vocab_size=VOCAB,
        hidden_size=16,
        max_position_embeddings=32,
        num_layers=layers,
        num_heads=4,
        attention_types=[[[kind], 1] for kind in kinds],
        window_size=4,
        attn_implementation="eager",
    )
    return _build(config, hf.GPTNeoForCausalLM, dtype)


def gemma3(dtype: torch.dtype = torch.float64, layers: int = 3) -> torch.nn.Module:
    """The multimodal Gemma 3 (text decoder plus a one-layer SigLIP vision tower), run on text."""
    config = hf.Gemma3Config(
        text_config=hf.Gemma3TextConfig(**GEMMA, num_hidden_layers=layers),
        vision_config=hf.SiglipVisionConfig(**VISION, num_hidden_layers=1),
        mm_tokens_per_image=4,
        boi_token_index=VOCAB - 3,
        eoi_token_index=VOCAB - 2,
        image_token_index=VOCAB - 1,
        attn_implementation="eager",
    )
    return _build(config, hf.Gemma3ForConditionalGeneration, dtype)


TEXT_BUILDERS = (
    llama, mistral, mixtral, qwen2, qwen3, gemma, gemma2, gemma3_text, gemma3, olmo, olmo2, phi,
    phi3, stablelm, gpt_neox, gpt2, gpt_neo, gptj, falcon, bloom, mpt, opt, bert, roberta,
)  # fmt: skip
ARCHITECTURES: dict[str, Builder] = {build.__name__: build for build in TEXT_BUILDERS}
IMAGE_ARCHITECTURES: dict[str, Builder] = {"vit": vit, "deit": deit}


class CharTokenizer:
    """A stand-in tokenizer: one token per character (ids mod the vocabulary)."""

    def __call__(self, text: str, return_tensors: str | None = None) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([[ord(c) % VOCAB for c in text]])}


@contextlib.contextmanager
def float64_exact() -> Iterator[None]:
    """Make HF's float32 islands respect float64, so that finite differences can reach 1e-6
    relative error: ``softmax(..., dtype=float32)``, and every ``Tensor.to(float32)`` /
    ``Tensor.float()`` of a float64 tensor (the upcasts of RMSNorm, Gemma's ``(1 + weight)`` norm,
    OLMo's LayerNorm, GPT-Neo/GPT-J's attention, MPT's softmax, Mixtral's router) keep float64.
    Harness only: the library is untouched."""
    softmax = torch.nn.functional.softmax
    own = {name: name in vars(torch.Tensor) for name in ("to", "float")}  # else inherited
    to, to_float = torch.Tensor.to, torch.Tensor.float

    def softmax64(input, dim=None, _stacklevel=3, dtype=None):  # noqa: ANN001
        if input.dtype == torch.float64:
            dtype = None
        return softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    def to64(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        result = to(self, *args, **kwargs)
        if self.dtype == torch.float64 and result.dtype == torch.float32:
            return to(self, device=result.device)
        return result

    def float64(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self if self.dtype == torch.float64 else to_float(self, *args, **kwargs)

    torch.nn.functional.softmax = softmax64
    torch.Tensor.to, torch.Tensor.float = to64, float64
    try:
        yield
    finally:
        torch.nn.functional.softmax = softmax
        for name, original in (("to", to), ("float", to_float)):
            if own[name]:
                setattr(torch.Tensor, name, original)
            else:
                delattr(torch.Tensor, name)
