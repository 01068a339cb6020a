"""How a model runs while its Jacobians are taken: eager attention, eval mode and the CUDA
float32 matmul precision, each a context manager that restores the previous setting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Run with eager attention (sdpa has no forward AD and a slow vmap backward on CPU), and
    record masks under it (eager without a mask is not causal): Hugging Face models through
    their attention implementation, timm-style modules by their ``fused_attn`` flag. Restores
    the previous settings.
    """
    previous = getattr(getattr(model, "config", None), "_attn_implementation", None)
    switch = previous not in (None, "eager") and hasattr(model, "set_attn_implementation")
    fused = [m for m in model.modules() if getattr(m, "fused_attn", False) is True]
    if switch:
        model.set_attn_implementation("eager")
    for module in fused:
        module.fused_attn = False
    try:
        yield
    finally:
        if switch:
            model.set_attn_implementation(previous)
        for module in fused:
            module.fused_attn = True


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Run in eval mode (no dropout, no drop path); restores the previous mode."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def matmul_precision(tf32: bool) -> Iterator[None]:
    """CUDA float32 matmuls and convolutions in TensorFloat-32 (``tf32``) or full IEEE float32
    for the duration; restores the previous settings (CPU computations are unaffected).
    """
    backends = (torch.backends.cuda.matmul, torch.backends.cudnn)
    previous = [backend.fp32_precision for backend in backends]
    for backend in backends:
        backend.fp32_precision = "tf32" if tf32 else "ieee"
    try:
        yield
    finally:
        for backend, value in zip(backends, previous):
            backend.fp32_precision = value
