"""What the instruction-set pin (blockcoupling.runtime.isa) changes: the numbers, and the time.

Usage:
  python bench/isa_pin.py [--repeats 3] [--steps 40] [--d-model 64] [--layers 4] [--width 576]
                          [--context 32] [--vocab 300]   (the default's training: 128, 2048)
  python bench/isa_pin.py --worker [same sizes]   (one run in this process: JSON on stdout)

Each run, in a fresh process, trains a GPT-NeoX with the workflow's train code (``--steps`` AdamW
steps, ``--layers`` blocks of width ``--d-model``) and a small ViT with the workflow's ViT code
(2 epochs on the digits; ``--context`` tokens per sequence, 8 sequences per step, a vocabulary
of ``--vocab``), then extracts: every block's depth Jacobian at the last token of a
random GPT-NeoX of width ``--width`` (2 blocks, 16 tokens) and its full SVD, and the
composed ``J_tt`` of a random Llama of that width with its randomized top-8 SVD, and numpy's
float64 ``exp``, ``log`` and ``arctanh`` of 200,000 values (the metrics' and statistics' own
loops, which numpy picks by CPU). It reports a
SHA-256 of the weights and of the Jacobians and singular triplets, and each part's seconds.
Five environments run interleaved, ``--repeats`` times, on one thread each:

- ``pinned``: the jobs' environment (``isa.job_env()``) on this CPU;
- ``pinned_avx2_cpu``: the same, with every library told the CPU stops at AVX2 (``AVX2_CPU``:
  the caps of ATen, MKL, oneDNN, OpenBLAS and numpy; all but MKL's are the pin's own,
  so a library the pin left out would differ);
- ``pinned_mkl``: the pin with the matmuls left on MKL's ``COMPATIBLE`` branch, as before
  ``runtime.blas`` sent them to OpenBLAS (timed only);
- ``native``: no pin, each library's own dispatch on this CPU;
- ``native_avx2_cpu``: no pin, every library capped at AVX2 as on an AVX2-only CPU.

With ``--emulate``, a fifth run, ``pinned_emulated``, runs the pinned environment once under
QEMU's user-mode emulator as another vendor's CPU (``EMULATED``: an Intel Haswell, GenuineIntel,
AVX2 and FMA, no AVX-512, its own cache sizes, and exact results where a real CPU's approximate
reciprocal instructions differ by vendor): what every library sees through ``cpuid`` changes,
not only the caps they are told. Debian: ``apt-get install qemu-user``; about 30-60x slower.

It prints a markdown report: whether pinned and pinned_avx2_cpu (and native and native_avx2_cpu,
pinned and pinned_emulated) are bit-identical, and the median seconds of pinned over native.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PIN_KEYS = (
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "MKL_DYNAMIC",
    "OMP_DYNAMIC",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "OPENBLAS_CORETYPE",
    "NPY_DISABLE_CPU_FEATURES",
    "MKL_ENABLE_INSTRUCTIONS",
    "BLOCKCOUPLING_ISA",
)
AVX2_CPU = {  # what each library is told of an AVX2-only CPU
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
}
NO_ROUTE = "ISA_PIN_MKL_MATMULS"  # set: the worker leaves the matmuls on MKL (pinned_mkl)
PARTS = ("train_lm", "train_vit", "extract", "extract_llama", "numpy")
EMULATED = ("qemu-x86_64", "-cpu", "Haswell")  # another vendor's x86-64 CPU, emulated
# the sizes of a run under EMULATED (30-60x slower): tests/test_isa.py and bench/isa_record.py
EMULATED_SIZES = ["--steps=4", "--d-model=16", "--layers=2", "--width=64"]


def environments() -> dict[str, dict[str, str]]:
    """The four environments: this process's, less every pin variable, plus each one's own."""
    from blockcoupling.runtime import isa  # no torch

    base = {k: v for k, v in os.environ.items() if k not in PIN_KEYS}
    base.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    pinned = {**base, **isa.job_env()}
    return {
        "pinned": pinned,
        "pinned_avx2_cpu": {**pinned, **AVX2_CPU},  # fails if the pin leaves a library out
        "pinned_mkl": {**pinned, NO_ROUTE: "1"},
        "native": {**base, "BLOCKCOUPLING_ISA": "native"},
        "native_avx2_cpu": {**base, "BLOCKCOUPLING_ISA": "native", **AVX2_CPU},
    }


def _digest(tensors: dict) -> str:
    sha = hashlib.sha256()
    for name in sorted(tensors):
        sha.update(name.encode())
        sha.update(tensors[name].detach().contiguous().cpu().numpy().tobytes())
    return sha.hexdigest()


def worker(args: argparse.Namespace) -> dict:
    """One run in this process (its environment already set): digests and seconds per part."""
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    from blockcoupling.jacobians import spectral
    from blockcoupling.jacobians.engine import JacobianEngine
    from blockcoupling.jacobians.options import SVDOptions
    from blockcoupling.lm.training.schedule import TrainConfig
    from blockcoupling.lm.training.train import train
    from blockcoupling.runtime import blas
    from blockcoupling.vit import data as vision_data
    from blockcoupling.vit.config import ViTRunConfig
    from blockcoupling.vit.train import train_vit

    if not os.environ.get(NO_ROUTE):
        blas.route_if_pinned()  # as every pinned job
    out: dict = {"capability": torch.backends.cpu.get_cpu_capability()}
    with tempfile.TemporaryDirectory() as tmp:
        lm = TrainConfig(
            n_layers=args.layers,
            d_model=args.d_model,
            n_heads=2,
            context_length=args.context,
            batch_size=8,
            learning_rate=3e-3,
            total_steps=args.steps,
            vocab_size=args.vocab,
            checkpoint_steps=[args.steps],
            n_val_windows=8,
            max_train_chars=150_000,
        )
        t0 = time.perf_counter()
        last = train(lm, Path(tmp) / "lm", progress=False, threads=1)
        out["train_lm"] = (_digest(load_file(last / "model.safetensors")), time.perf_counter() - t0)
        vit = ViTRunConfig(
            embed_dim=16, depth=2, num_heads=2, patch_size=4, epochs=2, warmup_epochs=1
        )
        digits = vision_data.digits(0)
        t0 = time.perf_counter()
        weights = train_vit(vit, digits, Path(tmp) / "vit", threads=1, progress=False)
        out["train_vit"] = (_digest(load_file(str(weights))), time.perf_counter() - t0)

    def random_decoder(config_class: type, model_class: type, mlp_width: int) -> torch.nn.Module:
        """A seeded random decoder of 2 blocks of width ``--width``, in eval mode."""
        torch.manual_seed(0)
        config = config_class(
            vocab_size=300,
            hidden_size=args.width,
            num_hidden_layers=2,
            num_attention_heads=args.width // 64,
            intermediate_size=mlp_width,
            attn_implementation="eager",
        )
        return model_class(config).eval()

    model = random_decoder(GPTNeoXConfig, GPTNeoXForCausalLM, 4 * args.width)
    ids = torch.randint(0, 300, (1, 16), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    engine = JacobianEngine(model, {"input_ids": ids})
    found = {}
    for layer in range(model.config.num_hidden_layers):
        jac = engine.output_token(layer, 15)  # (t1, d, d)
        svd = spectral.svd(jac)
        found.update({f"{layer}.jac": jac, f"{layer}.u": svd.u, f"{layer}.s": svd.s})
        found[f"{layer}.v"] = svd.v
    out["extract"] = (_digest(found), time.perf_counter() - t0)
    # a Llama: its J_tt composed from weights (RMSNorm), top-K randomized
    model = random_decoder(LlamaConfig, LlamaForCausalLM, 2 * args.width)
    t0 = time.perf_counter()
    engine = JacobianEngine(model, {"input_ids": ids})
    found = {}
    for layer in range(1, model.config.num_hidden_layers + 1):
        jac = engine.diagonal(layer, 15)  # (d, d)
        top = spectral.randomized_top_k(jac, 8, SVDOptions(method="topk"))
        found.update({f"{layer}.jac": jac, f"{layer}.u": top.u, f"{layer}.s": top.s})
    if engine.composed == 0:
        raise RuntimeError("the Llama's J_tt was not composed")
    out["extract_llama"] = (_digest(found), time.perf_counter() - t0)
    t0 = time.perf_counter()  # numpy's own float64 loops, as the metrics and statistics use them
    x = np.random.default_rng(0).standard_normal(200_000) * 10
    values = {"exp": np.exp(x), "log": np.log(np.abs(x)), "arctanh": np.arctanh(np.tanh(x) * 0.99)}
    digest = _digest({name: torch.from_numpy(v) for name, v in values.items()})
    out["numpy"] = (digest, time.perf_counter() - t0)
    return out


def run_in(env: dict[str, str], sizes: list[str], prefix: tuple[str, ...] = ()) -> dict:
    """The worker in a fresh process under ``env`` (run by ``prefix``, e.g. ``EMULATED``): its
    JSON."""
    done = subprocess.run(
        [*prefix, sys.executable, __file__, "--worker", *sizes],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(runs: dict[str, list[dict]], args: argparse.Namespace) -> str:
    """The markdown report of interleaved runs."""

    def same(a: str, b: str, part: str) -> str:
        digests = {r[part][0] for r in runs[a] + runs[b]}
        return "identical" if len(digests) == 1 else "differ"

    def median(name: str, part: str) -> float:
        return statistics.median(r[part][1] for r in runs[name])

    emulated = "pinned_emulated" in runs
    lines = [
        f"# ISA pin: {platform.processor() or platform.machine()}, "
        f"torch capability {runs['native'][0]['capability']} unpinned, "
        f"{runs['pinned'][0]['capability']} pinned; {args.repeats} interleaved repeats, 1 thread",
        "",
        f"Sizes: GPT-NeoX {args.layers} x {args.d_model}, {args.steps} steps of 8 x "
        f"{args.context} tokens, vocabulary {args.vocab}; ViT 16 wide, "
        f"2 epochs; extraction at width {args.width}, 2 blocks, 16 tokens.",
        "",
        "| part | pinned vs pinned on an AVX2 CPU | unpinned vs unpinned on an AVX2 CPU "
        + ("| pinned vs pinned on an emulated Intel Haswell " if emulated else "")
        + "| pinned s | pinned, matmuls on MKL s | unpinned s | pinned / unpinned "
        + "| pinned on MKL / unpinned |",
        "|---|---|---|---|---|---|---|---|" + ("---|" if emulated else ""),
    ]
    for part in PARTS:
        pinned, native, mkl = (median(n, part) for n in ("pinned", "native", "pinned_mkl"))
        lines.append(
            f"| {part} | {same('pinned', 'pinned_avx2_cpu', part)} "
            f"| {same('native', 'native_avx2_cpu', part)} "
            + (f"| {same('pinned', 'pinned_emulated', part)} " if emulated else "")
            + f"| {pinned:.2f} | {mkl:.2f} | {native:.2f} | {pinned / native:.2f} "
            + f"| {mkl / native:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="one run in this process")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=576)
    parser.add_argument("--context", type=int, default=32, help="tokens per training sequence")
    parser.add_argument("--vocab", type=int, default=300, help="the GPT-NeoX's vocabulary")
    parser.add_argument("--emulate", action="store_true", help="also one pinned run in QEMU")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    sizes = [
        f"--steps={args.steps}",
        f"--d-model={args.d_model}",
        f"--layers={args.layers}",
        f"--width={args.width}",
        f"--context={args.context}",
        f"--vocab={args.vocab}",
    ]
    envs = environments()
    runs: dict[str, list[dict]] = {name: [] for name in envs}
    for _ in range(args.repeats):  # interleaved: the machine's load hits every environment alike
        for name, env in envs.items():
            runs[name].append(run_in(env, sizes))
    if args.emulate:
        runs["pinned_emulated"] = [run_in(envs["pinned"], sizes, EMULATED)]
    print(report(runs, args), end="")


if __name__ == "__main__":
    main()
