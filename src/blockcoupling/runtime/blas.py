"""Pinned jobs' matrix products through numpy's OpenBLAS, on its fixed AVX2 (Haswell) kernels.

The pin (``runtime.isa``) holds MKL to its one vendor-independent branch, ``MKL_CBWR=COMPATIBLE``
(SSE2), where a float32 GEMM runs at about a third of its AVX2 speed: training spent half its
time in it. OpenBLAS under ``OPENBLAS_CORETYPE=Haswell`` (also the pin's) runs the same AVX2+FMA
kernels with the same blocking on every x86-64 CPU that has them, whatever its vendor, so
``route_matmuls`` sends ATen's CPU ``mm``, ``bmm`` and ``addmm`` there. Autograd, ``torch.func``
transforms and forward-mode AD sit above the backend kernel and keep working; every other op
(attention's fused kernel, ``mv``, LAPACK) stays on the pinned MKL. CUDA is untouched.
Like ``isa``, part of every job's code path (the runner routes a job that loaded torch), so it
imports torch and numpy only when called.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from blockcoupling.runtime import isa

if TYPE_CHECKING:
    import numpy as np
    import torch

_library: Any = None  # the torch.library registration; kept alive while routed


def _array(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's data as an array (no copy where its layout allows)."""
    return tensor.numpy(force=True)


def _product(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` by numpy's matmul (OpenBLAS's GEMM for float types), ATen's checks kept:
    equal dtypes, matching inner sizes (RuntimeError, as ATen raises).
    """
    if a.dtype != b.dtype:
        raise RuntimeError(
            f"{op}: expected both matrices to have the same dtype ({a.dtype}, {b.dtype})"
        )
    if a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
        raise RuntimeError(
            f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied"
        )
    import numpy as np
    import torch

    numpy_types = (torch.float32, torch.float64, torch.complex64, torch.complex128, torch.int64)
    if a.dtype not in numpy_types:  # float16/bfloat16: accumulate in float32, as ATen does
        return _product(op, a.float(), b.float()).to(a.dtype)
    with np.errstate(all="ignore"):  # inf and NaN propagate silently, as in ATen
        return torch.from_numpy(np.matmul(_array(a), _array(b)))


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aten::mm, (n, k) @ (k, m) -> (n, m)."""
    if a.dim() != 2 or b.dim() != 2:
        raise RuntimeError(f"mm: expected 2-D tensors, got {a.dim()}-D and {b.dim()}-D")
    return _product("mm", a, b)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aten::bmm, (B, n, k) @ (B, k, m) -> (B, n, m)."""
    if a.dim() != 3 or b.dim() != 3:
        raise RuntimeError(f"bmm: expected 3-D tensors, got {a.dim()}-D and {b.dim()}-D")
    return _product("bmm", a, b)


def addmm(
    bias: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    beta: complex = 1,
    alpha: complex = 1,
) -> torch.Tensor:
    """aten::addmm, ``beta * bias + alpha * (a @ b)`` (bias broadcast to (n, m); ignored,
    NaNs included, when beta is 0, as ATen does).
    """
    product = mm(a, b)
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    if bias.dtype != product.dtype:
        raise RuntimeError(f"addmm: bias dtype {bias.dtype} differs from {product.dtype}")
    return product + (bias if beta == 1 else bias * beta)


def route_matmuls() -> None:
    """Send ATen's CPU ``mm``, ``bmm`` and ``addmm`` to numpy's OpenBLAS in this process (once;
    a second call does nothing). Call it only where the pin holds: under another
    ``OPENBLAS_CORETYPE`` OpenBLAS picks its kernels by CPU.
    """
    global _library
    if _library is not None:
        return
    import torch

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": the point
        warnings.simplefilter("ignore", UserWarning)
        for name, kernel in (("mm", mm), ("bmm", bmm), ("addmm", addmm)):
            library.impl(name, kernel, "CPU")
    _library = library


def route_if_pinned() -> None:
    """``route_matmuls()`` where this process runs the pin (``isa.pinned()``); with
    ``BLOCKCOUPLING_ISA=native``, MKL's own dispatch as before.
    """
    if isa.pinned():
        route_matmuls()


def routed() -> bool:
    """Whether this process's CPU matmuls go through numpy's OpenBLAS."""
    return _library is not None
