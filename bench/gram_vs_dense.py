"""Top-K spectra on one device: the Gram path against the dense SVD, in time and in accuracy.

Usage: python bench/gram_vs_dense.py [--device cuda] [--shapes 30x576 32x2048] [--k 50]
       [--repeats 3]

For each ``MxD`` shape, M random ``D x D`` float32 Jacobians (entries N(0, 1/D), seed 0) on
``--device``. It prints the median seconds (one warm-up, the device synchronized) of the dense
float32 SVD (``factors.svd``), of ``gram.gram_top_k`` and of the pair statistics of both
variants (``statistics.pair_stats`` against the per-reference loop of ``cross_stats``), and
each top-K path's distance from the dense float64 SVD of the same matrices on the same device:
the largest singular-value error relative to ``s_1`` and the smallest ``||V_64^T V||_F^2 / K``
(1 for the same orthonormal subspace; above 1 where the vectors are not orthonormal).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from blockcoupling.jacobians.factors import SVD, svd
from blockcoupling.jacobians.gram import gram_top_k
from blockcoupling.jacobians.statistics import bases, cross_stats, pair_stats

VARIANTS = ("ujv", "vju")


def seconds(step: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall seconds of ``step`` after one warm-up, the device synchronized."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def distance(got: SVD, ref: SVD) -> tuple[float, float]:
    """(max |s - s_64| / s_1, min ||V_64^T V||_F^2 / K) over the batch."""
    k = ref.s.shape[-1]
    s_err = ((got.s.double() - ref.s).abs().max() / ref.s.max()).item()
    overlap = ((ref.v.mT @ got.v.double()).pow(2).sum((-2, -1)) / k).min().item()
    return s_err, overlap


def shape(text: str) -> tuple[int, int]:
    """``MxD`` -> (M, D)."""
    m, d = text.lower().split("x")
    return int(m), int(d)


def report(jac: torch.Tensor, k: int, repeats: int) -> None:
    """Print the times and distances of one stack ``jac (m, d, d)`` at top ``k``."""
    m, d, device = jac.shape[0], jac.shape[-1], jac.device
    ref = svd(jac.double()).top(k)
    gram = gram_top_k(jac, k).factors
    dense = svd(jac).top(k)
    t_dense = seconds(lambda: svd(jac), device, repeats)
    t_gram = seconds(lambda: gram_top_k(jac, k), device, repeats)
    t_pairs = seconds(lambda: pair_stats(jac, gram, VARIANTS), device, repeats)
    t_loop = seconds(lambda: [cross_stats(jac, *bases(gram, v)) for v in VARIANTS], device, repeats)
    print(f"{m} x {d} x {d}, K = {k}, {device}:")
    print(
        f"  dense float32 SVD  {t_dense:8.4f} s   vs float64: s {distance(dense, ref)[0]:.1e}"
        f", subspace {distance(dense, ref)[1]:.8f}"
    )
    print(
        f"  gram_top_k         {t_gram:8.4f} s   vs float64: s {distance(gram, ref)[0]:.1e}"
        f", subspace {distance(gram, ref)[1]:.8f}   ({t_dense / t_gram:.1f}x)"
    )
    print(
        f"  pair_stats         {t_pairs:8.4f} s   per-reference loop {t_loop:.4f} s"
        f"   ({t_loop / t_pairs:.1f}x)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--shapes", nargs="+", type=shape, default=[(30, 576)], metavar="MxD")
    parser.add_argument("--k", type=int, default=50, help="top K (default 50)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (default 3)")
    args = parser.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    for m, d in args.shapes:
        report((torch.randn(m, d, d, generator=gen) / d**0.5).to(device), args.k, args.repeats)


if __name__ == "__main__":
    main()
