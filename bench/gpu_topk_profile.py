"""The randomized top-50 SVD of 2 x (4096, 4096) on the GPU: a flat and a decaying spectrum.

Usage: python bench/gpu_topk_profile.py  (a CUDA GPU). Prints the mean seconds of 3 calls of
``randomized_top_k`` and of the dense ``svd`` for each spectrum, then torch.profiler's table
of one top-K call on the decaying spectrum (bench/runs/gpu_check_h200.md).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check  # noqa: E402  (bench/: the decaying spectrum of the rates)

from blockcoupling.jacobians.spectral import SVDOptions, randomized_top_k, svd  # noqa: E402

D = 4096
TOP = SVDOptions(method="topk")


def spectra() -> dict[str, torch.Tensor]:
    """A flat (Gaussian) and a decaying (s_i = 0.97^i, ``gpu_check.decaying_spectrum``) stack
    of two (D, D) matrices on the GPU."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    flat = torch.randn(2, D, D, device="cuda", generator=generator) / D**0.5
    return {
        "flat (Gaussian)": flat,
        "decaying (s_i = 0.97^i)": gpu_check.decaying_spectrum(D, 2, "cuda"),
    }


def mean_seconds(function: Callable[[], object], repeats: int = 3) -> float:
    """Mean wall seconds of ``function()`` after one warm-up, the GPU synchronized."""
    function()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    cases = spectra()
    for name, jac in cases.items():
        top = mean_seconds(lambda jac=jac: randomized_top_k(jac, 50, TOP))
        dense = mean_seconds(lambda jac=jac: svd(jac))
        print(f"{name}: topk {top:.3f} s, dense {dense:.3f} s", flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        randomized_top_k(cases["decaying (s_i = 0.97^i)"], 50, TOP)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
