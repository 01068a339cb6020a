"""Deterministic training runs: the same config and seed give bit-identical weights, on any
x86-64 CPU (with the pin of ``runtime.isa``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def deterministic(threads: int | None) -> Iterator[None]:
    """Deterministic algorithms (without the NaN-filling of new tensors, which makes CPU training
    ~5x slower; cuBLAS with a fixed workspace) and ``threads`` torch threads for the duration;
    restored afterwards.
    """
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    old_fill = torch.utils.deterministic.fill_uninitialized_memory
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if threads is not None:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)
        torch.utils.deterministic.fill_uninitialized_memory = old_fill


def adamw(groups: list[dict], **options: float | tuple[float, float]) -> torch.optim.AdamW:
    """``torch.optim.AdamW(groups, **options)`` on its fused kernel (ATen's own vectorized code).
    The default per-tensor AdamW takes its square roots through MKL's vector math, which picks
    its code by CPU vendor whatever ``MKL_CBWR`` says (``isa.VENDOR_DEPENDENT_OPS``): its weights
    differed between an AMD CPU and an emulated Intel one after the first step.
    """
    return torch.optim.AdamW(groups, fused=True, **options)
