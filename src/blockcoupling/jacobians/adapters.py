"""The one adapter table: where each architecture keeps its transformer blocks (a dotted path
below ``model.base_model``), whether it is causal, and how its single-token ``J_tt`` is composed
from its weights (``token_jacobian``). Nothing else in the library depends on the architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


class UnknownArchitectureError(ValueError):
    """An architecture that the adapter table does not list."""


@dataclass(frozen=True)
class TokenJacobian:
    """How ``token_jacobian`` composes a pre-norm rotary decoder block's ``J_tt``: RMSNorm
    scales ``offset + weight`` (``norm_offset``: 1 for Gemma), ``sandwich`` norms (Gemma 2/3:
    the attention and MLP outputs normed, the MLP input by ``pre_feedforward_layernorm``), and
    per-head ``qk_norm`` before the rotary embedding (Qwen3, Gemma 3).
    """

    norm_offset: float = 0.0
    sandwich: bool = False
    qk_norm: bool = False


LLAMA_LIKE = TokenJacobian()
GEMMA_SANDWICH = TokenJacobian(norm_offset=1.0, sandwich=True)
GEMMA3 = TokenJacobian(norm_offset=1.0, sandwich=True, qk_norm=True)


@dataclass(frozen=True)
class Adapter:
    """Where an architecture keeps its blocks (dotted path below ``model.base_model``), and
    ``token_jacobian``: how its single-token ``J_tt`` is composed from the weights (None: by
    autograd through the re-invoked block).
    """

    blocks: str
    causal: bool = True
    token_jacobian: TokenJacobian | None = None


# The one adapter table. Keys are ``config.model_type``; models without a Hugging Face config
# are keyed ``<top-level package>.<class name>`` (``architecture_key``). Paths as the pinned
# transformers (5.23) lays the modules out (ViT and DeiT keep their blocks in ``layers``, no
# ``encoder``). Every entry is checked against finite differences on a tiny random model
# (tests/test_jacobians.py), the composed single-token ``J_tt`` (``token_jacobian``) too.
ADAPTERS: dict[str, Adapter] = {
    "llama": Adapter("layers", token_jacobian=LLAMA_LIKE),
    "mistral": Adapter("layers", token_jacobian=LLAMA_LIKE),
    "mixtral": Adapter("layers"),
    "qwen2": Adapter("layers", token_jacobian=LLAMA_LIKE),
    "qwen3": Adapter("layers", token_jacobian=TokenJacobian(qk_norm=True)),
    "gemma": Adapter("layers", token_jacobian=TokenJacobian(norm_offset=1.0)),
    "gemma2": Adapter("layers", token_jacobian=GEMMA_SANDWICH),
    "gemma3_text": Adapter("layers", token_jacobian=GEMMA3),
    "gemma3": Adapter(
        "language_model.layers", token_jacobian=GEMMA3
    ),  # text prompts: image tokens attend both ways
    "olmo": Adapter("layers"),
    "olmo2": Adapter("layers"),
    "phi": Adapter("layers"),
    "phi3": Adapter("layers"),
    "stablelm": Adapter("layers"),
    "gpt_neox": Adapter("layers"),
    "gpt2": Adapter("h"),
    "gpt_neo": Adapter("h"),
    "gptj": Adapter("h"),
    "falcon": Adapter("h"),
    "bloom": Adapter("h"),
    "mpt": Adapter("blocks"),
    "opt": Adapter("decoder.layers"),
    "bert": Adapter("encoder.layer", causal=False),
    "roberta": Adapter("encoder.layer", causal=False),
    "vit": Adapter("layers", causal=False),
    "deit": Adapter("layers", causal=False),
    "blockcoupling.VisionTransformer": Adapter("blocks", causal=False),
}


def architecture_key(model: nn.Module) -> str:
    """The model's key in ADAPTERS: ``config.model_type`` for Hugging Face models, else
    ``<top-level package>.<class name>`` (e.g. ``blockcoupling.VisionTransformer``).
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is not None:
        return str(model_type)
    cls = type(model)
    return f"{cls.__module__.split('.')[0]}.{cls.__name__}"


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter of a loaded Hugging Face model, or a one-line error naming the fix."""
    model_type = architecture_key(model)
    if model_type not in ADAPTERS:
        supported = ", ".join(sorted(ADAPTERS))
        raise UnknownArchitectureError(
            f"unknown architecture {model_type!r} ({type(model).__name__}); "
            f"supported: {supported}. "
            f"To add it, add one line to blockcoupling.jacobians.adapters.ADAPTERS, e.g. "
            f"{model_type!r}: Adapter('layers'), "
            "with the path of its block list below model.base_model"
        )
    return ADAPTERS[model_type]


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks in depth order (length L)."""
    adapter = adapter_for(model)
    node: Any = getattr(model, "base_model", model)
    for name in adapter.blocks.split("."):
        if not hasattr(node, name):
            raise UnknownArchitectureError(
                f"{type(model).__name__}: no attribute {name!r} on the path {adapter.blocks!r} of "
                f"ADAPTERS[{architecture_key(model)!r}]; fix that entry"
            )
        node = getattr(node, name)
    return list(node)
