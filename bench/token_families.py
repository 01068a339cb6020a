"""The token families of one prompt against their floor: CPU seconds on one thread.

Usage: python bench/token_families.py [--d 256] [--layers 4] [--tokens 24] [--family 12]
       [--repeats 3] [--k 16]

A seeded random-init Llama (float32, eager attention, d / 64 heads, intermediate 2.6875 d) on
seeded random token ids; token families over the first ``--family`` tokens at blocks 1 and -1.
Methods, interleaved within each repeat (median over repeats, CPU seconds by
``time.process_time`` with ``torch.set_num_threads(1)`` and the BLAS pools at one thread):

- ``floor``: the VJPs every ``J_{t1 t2}`` (t1 <= t2 < n) needs, and no more: one batch of d
  VJPs of each output token t2 on its prefix, per token layer (``JacobianEngine.output_token``);
- ``shared``: the library's token families (``extract._token_families``): the floor's VJPs,
  their groups kept for the fixed-input family, the statistics, the self family's ``J_tt``;
- ``shared, recomputed``: the same with no group kept (``TOKEN_HOLD_BYTES = 0``: the VJPs twice,
  as a GPU job whose Jacobians do not fit does);
- ``jvp``: the fixed-input family as before: one batch of d JVPs of each input token on the
  whole prompt (``JacobianEngine.input_token``), on top of the floor.

Prints each method's seconds and its ratio to the floor, and the planner's FLOP counts of the
Jacobian products (``pipeline.cost.token_vjp_flops``; the JVP path as it counted them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from blockcoupling.jacobians import extract  # noqa: E402
from blockcoupling.jacobians.engine import JacobianEngine  # noqa: E402
from blockcoupling.jacobians.options import ExtractConfig  # noqa: E402
from blockcoupling.pipeline.cost import token_vjp_flops  # noqa: E402


def llama(d: int, layers: int) -> torch.nn.Module:
    """A seeded random-init Llama of ``layers`` blocks at width ``d`` (float32, eager)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=d,
        intermediate_size=int(2.6875 * d),
        num_hidden_layers=layers,
        num_attention_heads=max(1, d // 64),
        num_key_value_heads=max(1, d // 64),
        vocab_size=1000,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config).eval()


def run(method: str, model: torch.nn.Module, ids: torch.Tensor, n: int, k: int) -> float:
    """CPU seconds of one method (a fresh engine: its prefixes recorded inside the timing)."""
    layers = [1, len(model.model.layers)]
    start = time.process_time()
    with torch.no_grad():
        engine = JacobianEngine(model, {"input_ids": ids})
        if method == "floor":
            for t2 in range(n):
                for layer in layers:
                    engine.output_token(layer, t2)
        elif method == "jvp":
            for t2 in range(n):
                for layer in layers:
                    engine.output_token(layer, t2)
            for t1 in range(n):
                for layer in layers:
                    engine.input_token(layer, t1)
        else:
            config = ExtractConfig(k_max=k, token_layers=(1, -1), token_prompts=1)
            hold = extract.TOKEN_HOLD_BYTES
            extract.TOKEN_HOLD_BYTES = 0 if method == "shared, recomputed" else hold
            try:
                extract._token_families(engine, layers, n, config)
            finally:
                extract.TOKEN_HOLD_BYTES = hold
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24, help="prompt length")
    parser.add_argument("--family", type=int, default=12, help="tokens of the families")
    parser.add_argument("--k", type=int, default=16, help="k_max")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = llama(args.d, args.layers)
    ids = torch.randint(0, 1000, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    methods = ["floor", "shared", "shared, recomputed", "jvp"]
    run("shared", model, ids[:, :4], 3, 2)  # warm-up: every code path, small buffers
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    for repeat in range(args.repeats):
        for method in methods[repeat % len(methods) :] + methods[: repeat % len(methods)]:
            seconds[method].append(run(method, model, ids, args.family, args.k))
    floor = statistics.median(seconds["floor"])
    print(
        f"random Llama d={args.d}, {args.layers} blocks, prompt {args.tokens} tokens, families "
        f"over {args.family} at blocks 1 and {args.layers}; k_max {args.k}; one thread, "
        f"CPU seconds, median of {args.repeats} (interleaved)"
    )
    for method in methods:
        median = statistics.median(seconds[method])
        print(f"{method:<20} {median:8.2f} s  {median / floor:5.2f} x floor")
    p = 4 * args.d**2 + 3 * args.d * int(2.6875 * args.d)  # block parameters (no norms)
    nf, n = args.family, args.tokens
    shared = token_vjp_flops(nf, args.d, p)
    jvp = 6.0 * args.d * p * nf * n  # d JVPs of each of nf input tokens on the n-token prompt
    print(
        f"planner FLOPs per layer: floor (VJPs) {shared:.3g}; with the JVPs of before "
        f"{shared + jvp:.3g} ({(shared + jvp) / shared:.1f} x)"
    )


if __name__ == "__main__":
    main()
