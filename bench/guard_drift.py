"""The single-token guard's relative differences per block of a bfloat16 trained-like Llama, as
the engine checks it (the call at the full pass's input) and as it checked before (the call at
its own recorded input), each against the full pass re-run in float32.

Usage: python bench/guard_drift.py [--width 1024] [--layers 32] [--tokens 128] [--jitter]

``--jitter`` emulates a device whose bfloat16 kernels round a one-token or prefix pass
differently from the full pass (CUDA picks kernels by shape): every block output of those
passes is multiplied by ``1 + u 2^-8``, ``u`` uniform in [-1, 1] (up to one bfloat16 ulp), and
re-rounded; the full pass is untouched. One thread; prints one line per block.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trained_like  # noqa: E402  (bench/: the trained-like Llama)

from blockcoupling.jacobians.adapters import blocks_of  # noqa: E402
from blockcoupling.jacobians.engine import (  # noqa: E402
    JacobianEngine,
    _difference,
    _storage_tolerance,
)
from blockcoupling.jacobians.run_mode import eager_attention, eval_mode  # noqa: E402


def jitter_hook(tokens: int, generator: torch.Generator) -> Any:
    """A forward hook re-rounding a block's output by up to one bfloat16 ulp, except in the
    full pass of ``tokens`` tokens."""

    def hook(_module: Any, _args: Any, _kwargs: Any, out: Any) -> Any:
        hidden = out if isinstance(out, torch.Tensor) else out[0]
        if hidden.shape[1] == tokens:
            return None
        noise = (torch.rand(hidden.shape, generator=generator) * 2 - 1) * 2.0**-8
        moved = (hidden.float() * (1 + noise)).to(hidden.dtype)
        return moved if isinstance(out, torch.Tensor) else (moved, *out[1:])

    return hook


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--jitter", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    heads = max(1, args.width // 128)
    model = trained_like.trained_like_llama(
        args.width, args.layers, heads, max(1, heads // 4), int(3.5 * args.width), 1000,
        dtype=torch.bfloat16,
    )  # fmt: skip
    ids = torch.randint(0, 1000, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    t = args.tokens - 1
    with eager_attention(model), eval_mode(model), torch.no_grad():
        engine = JacobianEngine(model, {"input_ids": ids})
        hooks = []
        if args.jitter:
            hook = jitter_hook(args.tokens, torch.Generator().manual_seed(7))
            hooks = [b.register_forward_hook(hook, with_kwargs=True) for b in blocks_of(model)]
        calls = engine._token_calls_at(t)
        for handle in hooks:
            handle.remove()
        for layer in range(1, args.layers + 1):
            call, full = calls[layer - 1], engine.full[layer - 1]
            residual = engine._residual(call)
            expected = engine._expected(layer, t, torch.float32)
            old = _difference(residual(call.input.float())[0], expected)
            new = _difference(residual(full.input[t : t + 1].float())[0], expected)
            drift = _difference(call.input[0].float(), full.input[t].float())
            tolerance = _storage_tolerance(call.block)
            print(
                f"block {layer:2d}: old {old:.2e}{' REFUSED' if old > tolerance else ''}, "
                f"new {new:.2e}{' REFUSED' if new > tolerance else ''} (tolerance "
                f"{tolerance:.2e}); input drift {drift:.2e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
