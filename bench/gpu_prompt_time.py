"""Seconds per prompt of the paper config's extraction on a Llama-3-8B-sized model on a GPU.

Usage: python bench/gpu_prompt_time.py [--layers 32] [--width 4096] [--intermediate 14336]
       [--heads 32] [--kv-heads 8] [--vocab 128256] [--tokens 128] [--dtype bfloat16]
       [--device cuda]

A seeded random-init ``LlamaForCausalLM`` of Llama-3-8B's shape (32 blocks, width 4096, MLP
14336, 32 query and 8 key-value heads, vocabulary 128,256; weights in bfloat16, eager attention,
built on the device) goes through ``measure_inputs`` with config/paper.yaml's extraction
settings (k_max 50, the last token depth-wise, top-K SVDs, VJP chunks of 64, TF32 off) on
random token ids of ``--tokens`` tokens: one warm-up prompt, then a depth-wise prompt (what 190
of the 200 Jacobian prompts get), then one that also gets the full spectra (``svdvals`` of every
block: the first 10). Not timed: the token families of the first 10 prompts, whose 272 SVDs per
block of a random model's flat spectra would each take the dense fallback (~0.6 s at d = 4096
on an H200, bench/runs/gpu_check_h200.md), which a trained model's decaying spectra rarely
need. A random model's flat spectra send the depth-wise top-K SVDs to that fallback too, so
the SVD part is an upper bound. Prints the seconds of each.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import depth_speed  # noqa: E402  (bench/: the seeded random Llama)
import gpu_check  # noqa: E402  (bench/: waiting for the GPU)

from blockcoupling.jacobians.extract import MeasureConfig, PromptText, measure_inputs  # noqa: E402

SPECTRA = MeasureConfig(k_max=50, token_layers=(), spectra_prompts=1, chunk_size=64)
DEPTH_ONLY = replace(SPECTRA, spectra_prompts=0)


def build(args: argparse.Namespace) -> torch.nn.Module:
    """The random Llama on ``args.device`` in ``args.dtype`` (seeded)."""
    return depth_speed.random_llama(
        args.width,
        args.layers,
        heads=args.heads,
        vocab=args.vocab,
        intermediate=args.intermediate,
        kv_heads=args.kv_heads,
        device=args.device,
        dtype=getattr(torch, args.dtype),
    )


def seconds(model: torch.nn.Module, ids: torch.Tensor, config: MeasureConfig) -> float:
    """Wall seconds of ``measure_inputs`` on one prompt, the device synchronized."""
    gpu_check.sync()
    start = time.perf_counter()
    measure_inputs(model, [{"input_ids": ids}], [PromptText("p", "text", "")], config, None, False)
    gpu_check.sync()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (
        ("layers", 32), ("width", 4096), ("intermediate", 14336), ("heads", 32),
        ("kv-heads", 8), ("vocab", 128256), ("tokens", 128),
    ):  # fmt: skip
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model = build(args)
    generator = torch.Generator().manual_seed(1)
    ids = [
        torch.randint(0, args.vocab, (1, args.tokens), generator=generator).to(args.device)
        for _ in range(3)
    ]
    parameters = sum(p.numel() for p in model.parameters())
    print(f"Llama {args.layers} x {args.width}, {parameters / 1e9:.2f}B parameters, "
          f"{args.dtype}, {args.tokens} tokens, on {args.device}")  # fmt: skip
    print(f"warm-up (depth-wise): {seconds(model, ids[0], DEPTH_ONLY):.2f} s", flush=True)
    print(f"depth-wise prompt: {seconds(model, ids[1], DEPTH_ONLY):.2f} s", flush=True)
    print(f"prompt with full spectra: {seconds(model, ids[2], SPECTRA):.2f} s")
    if torch.cuda.is_available():
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
