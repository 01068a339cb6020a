"""The library on a CUDA GPU: the numbers the CPU gives, and the rates the cost model assumes.

Usage: python bench/gpu_check.py [--width 4096] [--layers 2] [--tokens 128] [--repeats 3]
       [--device cuda]  (``--device cpu``: the script's own check, CPU against CPU; the
       Jacobians' finite-difference check on the GPU is
       ``BLOCKCOUPLING_TEST_DEVICE=cuda pytest tests/test_jacobians.py``)

1. Agreement. A seeded random-init Llama (d = 512, 4 blocks, 16 tokens; float32, eager
   attention) and a GPT-NeoX of the same size (its J_tt by autograd, the Llama's composed from
   the weights) go through ``extract_inputs`` (depth-wise at the last token, token families of
   the last block over 8 tokens, top-50 factors, full spectra) and ``coupling_dataset`` on the
   CPU and on the GPU (TensorFloat-32 off, as ``extract.tf32: false``). It prints the largest
   absolute difference of m_K (every K, reading, norm, variant and pair), of the top-50
   singular values relative to the largest, and of the token families' statistics, each
   relative to its largest. Both devices compute in float32 with other kernels, so they agree
   to rounding, not in every bit.
2. Rates. A random Llama of width ``--width`` (``--layers`` blocks, ``--tokens`` tokens) on the
   GPU, each step timed whole with the device synchronized: every block's J_tt at the last
   token composed from the weights (the Llama path) and by d one-token VJPs (the path of
   architectures without a composition); a dense SVD, ``svdvals`` and the randomized top-50
   SVD of the stacked J; the dense and top-50 SVD of matrices with a decaying spectrum (a
   trained block's shape). It prints the rates in the units of ``pipeline.cost.Rates`` beside
   ``cost.GPU``: matmul is the effective FLOP/s under the cost model's count of the VJP path
   (``extract_cost``), not a hardware peak. Median of ``--repeats`` after one warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parent))
import depth_speed  # noqa: E402  (bench/: the seeded random Llama)

from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset  # noqa: E402
from blockcoupling.jacobians.engine import JacobianEngine  # noqa: E402
from blockcoupling.jacobians.extract import ExtractConfig, PromptText, extract_inputs  # noqa: E402
from blockcoupling.jacobians.spectral import SVDOptions, randomized_top_k, svd  # noqa: E402
from blockcoupling.jacobians.spectral import singular_values as svdvals  # noqa: E402
from blockcoupling.pipeline import cost  # noqa: E402

AGREEMENT = ExtractConfig(
    k_max=50,
    token_layers=(-1,),
    token_prompts=1,
    token_max_tokens=8,
    spectra_prompts=1,
    svd=SVDOptions(method="dense"),
)
METRICS = MetricConfig(ks=(4, 8, 50), norms=("p", "trace"))


def sync() -> None:
    """Wait for the GPU's queued work (nothing to wait for on a CPU-only torch)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_neox(d: int, layers: int) -> torch.nn.Module:
    """A seeded random-init GPT-NeoX: width d, d / 64 heads, float32, eager attention."""
    config = transformers.GPTNeoXConfig(
        vocab_size=depth_speed.VOCAB,
        hidden_size=d,
        intermediate_size=4 * d,
        num_hidden_layers=layers,
        num_attention_heads=max(1, d // 64),
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return transformers.GPTNeoXForCausalLM(config).to(torch.float32).eval()


def measured(model: torch.nn.Module, ids: torch.Tensor, device: str) -> dict:
    """m_K of the depth and token families and the top-K singular values, on ``device``."""
    model = model.to(device)
    data = extract_inputs(
        model, [{"input_ids": ids.to(device)}], [PromptText("p0", "text", "")], AGREEMENT,
        progress=False,
    )  # fmt: skip
    depth = coupling_dataset(data["depth"], METRICS)
    return {
        "depth m_K": depth["depth_mis"].values,
        "singular values": data["depth"]["singular_values"].values,
        "tokens": data["tokens"],
    }


def agreement(device: str) -> list[str]:
    """Markdown rows: the CPU against ``device`` for a Llama (composed J_tt) and a GPT-NeoX
    (autograd)."""
    ids = torch.randint(0, depth_speed.VOCAB, (1, 16), generator=torch.Generator().manual_seed(1))
    rows = []
    for name, build in (
        ("Llama 512 x 4", lambda: depth_speed.random_llama(512, 4)),
        ("GPT-NeoX 512 x 4", lambda: random_neox(512, 4)),
    ):
        on_cpu, there = measured(build(), ids, "cpu"), measured(build(), ids, device)
        s_cpu, s_there = on_cpu["singular values"], there["singular values"]
        rows.append(
            f"| {name} | {np.abs(on_cpu['depth m_K'] - there['depth m_K']).max():.2e} "
            f"| {np.abs(s_cpu - s_there).max() / np.abs(s_cpu).max():.2e} "
            f"| {relative_difference(on_cpu['tokens'], there['tokens']):.2e} "
            f"| {np.abs(on_cpu['depth m_K']).max():.3f} |"
        )
    return rows


def relative_difference(a: xr.Dataset, b: xr.Dataset) -> float:
    """Largest |a - b| over every float variable, each relative to its largest |a| (NaN: an
    entry undefined on both, e.g. a token pair outside the causal prefix)."""
    return max(
        float(np.nanmax(np.abs(a[name].values - b[name].values)) / np.nanmax(np.abs(a[name])))
        for name in a.data_vars
        if a[name].dtype.kind == "f"
    )


def median_seconds(function, repeats: int) -> float:  # noqa: ANN001
    """Median wall seconds of ``function()`` after one warm-up, the GPU synchronized."""
    function()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        function()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rates(d: int, layers: int, tokens: int, repeats: int, device: str) -> list[str]:
    """Markdown rows: each rate measured on ``device`` beside ``cost.GPU``'s."""
    model = depth_speed.random_llama(d, layers).to(device)
    ids = torch.randint(0, depth_speed.VOCAB, (1, tokens), generator=torch.Generator()).to(device)
    block = sum(p.numel() for p in depth_speed.blocks_of(model)[0].parameters())
    engine = JacobianEngine(model, {"input_ids": ids})
    last = tokens - 1

    def jacobians(composed: bool) -> None:
        if not composed:
            engine._composed = lambda layer, t: None  # the VJP path
        for layer in range(1, layers + 1):
            engine.diagonal(layer, last)
        engine.__dict__.pop("_composed", None)

    jac = torch.stack([engine.diagonal(layer, last) for layer in range(1, layers + 1)])
    decaying = decaying_spectrum(d, layers, device)
    top = SVDOptions(method="topk")
    seconds = {
        "matmul (FLOP/s, VJP path)": median_seconds(lambda: jacobians(False), repeats),
        "matmul (FLOP/s, composed J_tt)": median_seconds(lambda: jacobians(True), repeats),
        "dense_svd (s per d^3), the Llama's J": median_seconds(lambda: svd(jac), repeats),
        "dense_svd (s per d^3), decaying spectrum": median_seconds(lambda: svd(decaying), repeats),
        "svdvals (s per d^3), the Llama's J": median_seconds(lambda: svdvals(jac), repeats),
        "topk (s per d^2 (K + p)), the Llama's J": median_seconds(
            lambda: randomized_top_k(jac, 50, top), repeats
        ),
        "topk (s per d^2 (K + p)), decaying spectrum": median_seconds(
            lambda: randomized_top_k(decaying, 50, top), repeats
        ),
    }
    vjp = 3.0 * (2.0 * block + 4.0 * tokens * d)  # extract_cost's count
    flops = layers * (d * vjp + 2.0 * block * tokens)
    per = {"dense_svd": layers * d**3, "svdvals": layers * d**3}  # seconds per unit of work
    per["topk"] = layers * d**2 * (50 + top.oversample)
    rows = []
    for label, value in seconds.items():
        name = label.split(" ")[0]
        rate = flops / value if name == "matmul" else value / per[name]
        model_rate = getattr(cost.GPU, name)
        rows.append(
            f"| {label} | {value:.3f} | {rate:.3g} | {model_rate:.3g} | {rate / model_rate:.2f} |"
        )
    return rows


def decaying_spectrum(d: int, count: int, device: str) -> torch.Tensor:
    """``count`` matrices ``Q1 diag(0.97^i) Q2^T`` (d, d) with seeded random orthogonal Q: a
    spectrum that decays as a trained block's does (the random Llama's is flat, and a flat
    spectrum around the K-th value sends the randomized SVD to its dense fallback)."""
    generator = torch.Generator().manual_seed(2)
    q1, q2 = (
        torch.linalg.qr(torch.randn(count, d, d, generator=generator).to(device)).Q
        for _ in range(2)
    )
    values = 0.97 ** torch.arange(d, dtype=torch.float32, device=device)
    return (q1 * values) @ q2.mT


def device_line() -> str:
    """The GPU, the CPU and the versions, in words."""
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if "Model name" in ln), "")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return (
        f"GPU: {gpu}; CPU: {model}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to check this")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("bench/gpu_check.py: torch sees no CUDA GPU (--device cpu checks the script)")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    print(f"# bench/gpu_check.py\n\n{device_line()}\n")
    print(f"## CPU against {args.device} (float32, TF32 off)\n")
    print("| model | depth m_K, max abs diff | top-50 s, max diff / s_max | token families, "
          "max diff / max | depth m_K, max abs |\n|---|---|---|---|---|")  # fmt: skip
    print("\n".join(agreement(args.device)), flush=True)
    print(f"\n## Rates: Llama {args.width} x {args.layers}, {args.tokens} tokens, "
          f"median of {args.repeats}\n")  # fmt: skip
    print("| rate | seconds | measured | cost.GPU | measured / cost.GPU |")
    print("|---|---|---|---|---|")
    print("\n".join(rates(args.width, args.layers, args.tokens, args.repeats, args.device)))


if __name__ == "__main__":
    main()
