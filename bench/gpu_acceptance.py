"""The GPU acceptance run: paper scale on one GPU, measured in one prepared command.

Usage: python bench/gpu_acceptance.py [--out DIR] [--budget-s 420] [--dry-run]
       (``--dry-run``: the same steps on the CPU at a tiny shape, bitsandbytes left out; the test
       suite runs it)

Fits 8 minutes of device time: no step starts after ``--budget-s`` seconds (default 420, the
model's build included), none runs past it or past its own limit, and a step that needs more of
the budget than is left is skipped and says so. Each step adds its result to
``OUT/acceptance.json`` (and a line to standard output) as it ends, so a run stopped at its time
limit keeps what it measured. In order (step, its limit in seconds):

- ``build``: a Llama-3-8B-shaped model (32 blocks, width 4096, MLP 14336, 8 key-value heads,
  vocabulary 128,256) with trained-like decaying block spectra (``trained_like.py``), built on
  the device in bfloat16.
- ``paths`` (60): one 128-token prompt's depth-wise ``J_tt`` block by block as ``measure``
  takes them on the device (the timed choice of the single-token path, no full-sequence path):
  each block's method or the refusals that stopped it, both guards' differences (the
  single-token call at the full pass's input, what the engine checks; at its own recorded
  input, what it checked before) and their tolerance, the watchdog's lines, and a
  ``torch.profiler`` table of one warm ``diagonal`` call.
- ``fd`` (80): the Jacobians' finite-difference tests on the device
  (``BLOCKCOUPLING_TEST_DEVICE=cuda pytest tests/test_jacobians.py``); ``imports`` (30): a
  job's start, a fresh Python importing the extraction.
- ``composition`` (30): one block's ``J_tt`` composed and by one-token VJPs, timed, the
  composition's parts and costliest ops.
- ``first`` (40), ``depth-wise`` (30): config/paper.yaml's extraction (k_max 50, top-K SVDs,
  VJP chunks of 64, TF32 off; float32 Jacobians of the bfloat16 blocks) on 128 random tokens,
  each split into forward, Jacobians (of which the blocks' float32 upcast), spectra and pair
  statistics; the paths record of the depth file; the top-K path's outcomes and the host
  synchronizations its SVDs made.
- ``vjp`` (15): the depth-wise Jacobians of 2 blocks by d one-token VJPs (the path of
  architectures without a composition from the weights, e.g. GPT-NeoX/Pythia), for the cost
  model's matmul rate.
- ``svd`` (25): one block's Jacobian of this model and of a random-init one (a flat spectrum):
  dense SVD and the top-K path.
- ``rates`` (20, again at the end): the measured rates in the form ``pipeline/cost.py`` reads
  (``OUT/gpu_rates.json``) and the paper suite's GPU-hours under the rates before and after.
- ``loads`` (60): the model's first two blocks saved in bfloat16, loaded by ``load_model`` in
  bfloat16, with ``device_map: auto``, in 4-bit NF4 and in 8-bit (bitsandbytes); each block's
  ``J_tt`` from ``measure``'s engine against autograd inside a full forward of a float32 model
  carrying the loaded model's (dequantized) weights, at the loaded model's own block inputs.
- ``full spectra`` (60): the prompt with every block's full spectrum.
- ``full_loads`` (150): the whole model saved, then loaded with ``device_map: auto``, in 4-bit
  and in 8-bit: seconds to load, GPU memory, one depth-wise prompt's seconds and its largest
  m_K difference from the built model's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import depth_speed  # noqa: E402  (bench/: phase timers)
import trained_like  # noqa: E402  (bench/: the trained-like Llama)

from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset  # noqa: E402
from blockcoupling.jacobians import spectral  # noqa: E402
from blockcoupling.jacobians.adapters import adapter_for, blocks_of  # noqa: E402
from blockcoupling.jacobians.engine import JacobianEngine  # noqa: E402
from blockcoupling.jacobians.extract import ExtractConfig, PromptText, extract_inputs  # noqa: E402
from blockcoupling.jacobians.run_mode import (  # noqa: E402
    eager_attention,
    eval_mode,
    matmul_precision,
)
from blockcoupling.jacobians.token_jacobian import token_jacobian  # noqa: E402
from blockcoupling.lm.models import LoadOptions, load_model  # noqa: E402
from blockcoupling.lm.sources import ModelSource  # noqa: E402
from blockcoupling.pipeline import cost  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAPER = ExtractConfig(k_max=50, token_layers=(), spectra_prompts=0, chunk_size=64, max_tokens=128)
TINY = {"d": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 172, "vocab": 256}
METRICS = MetricConfig(ks=(4, 8, 50), norms=("p",))


class Run:
    """Steps under one time budget, their results kept in ``out/acceptance.json``."""

    def __init__(self, out: Path, budget_s: float, device: str):
        self.out, self.budget_s, self.device = out, budget_s, device
        self.start = time.perf_counter()
        self.results: dict[str, Any] = {}
        out.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def step(
        self, name: str, function: Callable[[], dict[str, Any]], needs_s: float, limit_s: int
    ) -> None:
        """Run ``function`` unless fewer than ``needs_s`` seconds of the budget are left, and
        stop it after ``limit_s`` seconds (or at the budget's end); an error or a stop is
        recorded, not raised, so that the later steps still run."""
        left = self.budget_s - self.elapsed()
        if left < needs_s:
            self.record(name, {"skipped": f"{left:.0f} s of the budget left, {needs_s:.0f} needed"})
            return
        began = time.perf_counter()
        try:
            with time_limit(int(min(limit_s, left))):
                result = function()
        except Exception as error:  # noqa: BLE001 (a step's failure is a result)
            result = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
        result["seconds"] = round(time.perf_counter() - began, 2)
        self.record(name, result)
        free_device_memory()

    def record(self, name: str, result: dict[str, Any]) -> None:
        self.results[name] = result
        (self.out / "acceptance.json").write_text(json.dumps(self.results, indent=1, default=str))
        print(f"[{self.elapsed():6.1f} s] {name}: {json.dumps(result, default=str)}", flush=True)


class StepTimeout(Exception):
    """A step ran past its limit."""


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise ``StepTimeout`` in the main thread after ``seconds`` (SIGALRM; none elsewhere)."""

    def stop(_signum: int, _frame: Any) -> None:
        raise StepTimeout(f"stopped after its limit of {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(max(1, seconds))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free_device_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gib(size: float) -> float:
    return round(size / 2**30, 2)


def peak_memory_gib() -> float | None:
    return gib(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the machine's architecture."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def environment(device: str) -> dict[str, Any]:
    """What ran: device, CPU, torch and the packages the steps use."""
    import transformers

    info = {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    with contextlib.suppress(ImportError):
        import bitsandbytes

        info["bitsandbytes"] = bitsandbytes.__version__
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        info["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
            check=True,
        ).stdout.strip()  # fmt: skip
    return info


# ---------------------------------------------------------------- 1. finite differences


def python_path() -> str:
    """This checkout's ``src`` before the caller's ``PYTHONPATH`` (packages carried there)."""
    return os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)


def finite_differences(device: str, dry_run: bool) -> dict[str, Any]:
    """``tests/test_jacobians.py`` on ``device`` (dry run: collected only)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "4",
               str(ROOT / "tests" / "test_jacobians.py")]  # fmt: skip
    if dry_run:
        command.append("--collect-only")
    env = {**os.environ, "BLOCKCOUPLING_TEST_DEVICE": device, "PYTHONPATH": python_path()}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    summary = (done.stdout.strip().splitlines() or [""])[-1]
    return {"returncode": done.returncode, "summary": summary, "device": device}


# ---------------------------------------------------------------- 2-3. the model and prompts


def build(shape: dict[str, int], device: str, dtype: torch.dtype) -> tuple[nn.Module, float]:
    """The trained-like Llama on ``device`` in ``dtype`` and its build seconds."""
    sync()
    began = time.perf_counter()
    model = trained_like.trained_like_llama(**shape, device=device, dtype=dtype)
    sync()
    return model, time.perf_counter() - began


def prompt_ids(vocab: int, tokens: int, seed: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, tokens), generator=generator).to(device)


@contextlib.contextmanager
def counted_syncs() -> Iterator[Counter[str]]:
    """Host synchronizations CUDA reports under ``set_sync_debug_mode('warn')`` (none off it)."""
    counts: Counter[str] = Counter()
    if not torch.cuda.is_available():
        yield counts
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counts
        finally:
            torch.cuda.set_sync_debug_mode("default")
    counts["syncs"] = sum("synchroniz" in str(w.message) for w in caught)


def live(phase: str, seconds: float) -> None:
    """Print a library call that took half a second or more, as it ends."""
    if seconds >= 0.5:
        print(f"    {phase}: {seconds:.2f} s", flush=True)


def timed_prompt(
    model: nn.Module, ids: torch.Tensor, config: ExtractConfig
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One prompt through ``extract_inputs``: its seconds by phase, the top-K path's outcomes
    and syncs; and the measured datasets. Calls of half a second or more are printed as they
    end."""
    phases = depth_speed.Phases(sync=sync, report=live)
    outcomes: Counter[str] = Counter()
    top_k = spectral.randomized_top_k
    syncs: Counter[str] = Counter()

    def counted(jac: torch.Tensor, k: int, options: Any, counts: Any = None) -> Any:
        found_outcomes: Counter[str] = Counter()
        with counted_syncs() as found:
            result = top_k(jac, k, options, found_outcomes)
        syncs.update(found)
        outcomes.update(found_outcomes)
        print(f"    top-K of {tuple(jac.shape)}: {dict(found_outcomes)}", flush=True)
        return result

    spectral.randomized_top_k = counted
    sync()
    began = time.perf_counter()
    try:
        with depth_speed.library_timers(phases):
            data = extract_inputs(
                model, [{"input_ids": ids}], [PromptText("p", "text", "")], config, None, False
            )
        sync()
    finally:
        spectral.randomized_top_k = top_k
    total = time.perf_counter() - began
    split = {name: round(value, 3) for name, value in phases.seconds.items()}
    split["of which upcast"] = round(phases.nested.get("upcast", 0.0), 3)
    split["rest"] = round(total - sum(phases.seconds.values()), 3)
    return {
        "seconds": round(total, 3),
        "split": split,
        "top-K": dict(outcomes),
        "top-K host syncs": syncs.get("syncs"),
        "paths": paths_of(data["depth"].attrs),
    }, data


def paths_of(attrs: dict[str, Any]) -> dict[str, Any]:
    """A depth file's record of how its ``J_tt`` were taken: counts, choice, refusals."""
    return {
        "composed": attrs["jtt_composed"],
        "autograd": attrs["jtt_autograd"],
        "full sequence": attrs["jtt_full_sequence"],
        "choice": attrs["jtt_choice"],
        "refusals": json.loads(attrs["jtt_refusals"]),
    }


def prompts(model: nn.Module, vocab: int, tokens: int, device: str, which: str) -> dict:
    """One prompt of the ``PAPER`` extraction: ``which`` is ``first`` (depth-wise, the one-off
    costs included), ``depth-wise`` or ``full spectra``."""
    config = replace(PAPER, max_tokens=tokens, spectra_prompts=int(which == "full spectra"))
    seed = {"first": 0, "depth-wise": 1, "full spectra": 2}[which]
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    result, data = timed_prompt(model, prompt_ids(vocab, tokens, seed, device), config)
    result["tokens"] = tokens
    result["peak GPU GiB"] = peak_memory_gib()
    if which == "depth-wise":
        PROMPT_DATA["built"] = data
    return result


PROMPT_DATA: dict[str, Any] = {}  # the built model's depth-wise datasets, for the loads' check


def paths(model: nn.Module, vocab: int, tokens: int, device: str) -> dict[str, Any]:
    """Step 0: how one ``PAPER`` prompt's every block takes its depth-wise ``J_tt``, as
    ``measure`` runs it (the timed choice on, no full-sequence path): per block the method, or
    the refusals that stopped it (``FullSequenceRefused``, caught here so that every block is
    seen), and both guards' differences: the single-token call at the full pass's input
    (``new``, what the engine checks) and at its own recorded input (``old``, what it checked
    before), each against the full pass re-run in float32, beside the tolerance. Then a
    ``torch.profiler`` table of one warm ``diagonal`` call."""
    from torch.profiler import ProfilerActivity, profile

    from blockcoupling.jacobians.capture import compute_dtype
    from blockcoupling.jacobians.engine import (
        FullSequenceRefused,
        MethodChoice,
        _difference,
        _storage_tolerance,
    )

    ids = prompt_ids(vocab, tokens, 1, device)
    blocks: dict[str, Any] = {}
    choice = MethodChoice(select=device != "cpu")
    with eager_attention(model), eval_mode(model), matmul_precision(PAPER.tf32):
        engine = JacobianEngine(model, {"input_ids": ids}, PAPER.chunk_size, "paths", choice)
        last = engine.n_tokens - 1
        for layer in range(1, len(engine.full) + 1):
            sync()
            began = time.perf_counter()
            try:
                engine.diagonal(layer, last)
                sync()
                method = next(m for (b, m) in engine.methods if b == layer)
            except FullSequenceRefused:
                method = "stopped: full sequence not allowed"
            row: dict[str, Any] = {"method": method,
                                   "seconds": round(time.perf_counter() - began, 4)}  # fmt: skip
            row["refusals"] = [r.describe() for r in engine.refused if r.layer == layer]
            calls = engine._token_calls_at(last)
            if calls is not None:
                call, full = calls[layer - 1], engine.full[layer - 1]
                dtype = compute_dtype(call.block)
                with torch.no_grad():
                    residual = engine._residual(call)
                    expected = engine._expected(layer, last, dtype)
                    row["guard, new"] = _difference(
                        residual(full.input[last : last + 1].to(dtype))[0], expected
                    )
                    row["guard, old"] = _difference(residual(call.input.to(dtype))[0], expected)
                row["tolerance"] = _storage_tolerance(call.block)
            blocks[str(layer)] = row
            print(f"    block {layer}: {json.dumps(row, default=str)}", flush=True)
        taken = [int(b) for b, row in blocks.items() if not row["method"].startswith("stopped")]
        table = "no block took a single-token path: nothing profiled"
        if taken:
            engine.diagonal(taken[0], last)  # warm
            activities = [ProfilerActivity.CPU] + (
                [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
            )
            with profile(activities=activities) as prof:
                engine.diagonal(taken[0], last)
                sync()
            sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
            table = f"block {taken[0]}:\n" + prof.key_averages().table(sort_by=sort, row_limit=12)
    print(table, flush=True)
    methods = Counter(row["method"] for row in blocks.values())
    return {
        "tokens": tokens,
        "methods": dict(methods),
        "choice": choice.method,
        "choice seconds": {m: round(s, 4) for m, s in choice.seconds.items()},
        "blocks": blocks,
        "slow blocks (watchdog)": engine.slow,
        "profile of one diagonal call": table.splitlines(),
    }


def composition_profile(model: nn.Module, vocab: int, tokens: int, device: str) -> dict:
    """One block's depth-wise ``J_tt`` composed from the weights and by d one-token VJPs, each
    timed after a warm-up, plainly and under ``measure``'s settings (eager attention, eval
    mode); under the latter the composition's parts (``token_jacobian``, the guard's
    full-sequence value) and its six costliest ops by device and by CPU time."""
    from torch.profiler import ProfilerActivity, profile

    result: dict[str, Any] = {}
    for setting in ("plain", "as measure runs"):
        with contextlib.ExitStack() as stack:
            if setting != "plain":
                stack.enter_context(eager_attention(model))
                stack.enter_context(eval_mode(model))
            stack.enter_context(matmul_precision(False))
            engine = JacobianEngine(model, {"input_ids": prompt_ids(vocab, tokens, 1, device)}, 64)
            last = engine.n_tokens - 1
            for path in ("composed", "VJPs"):
                if path == "VJPs":
                    engine._composed = lambda layer, t: None
                engine.diagonal(1, last)  # warm-up: the block's float32 copy, the token calls
                result[f"{path}, {setting}"] = _seconds(lambda e=engine, t=last: e.diagonal(1, t))
            del engine._composed  # the class's method again
            if setting == "plain":
                continue
            call = engine._token_calls_at(last)[0]
            block, spec = engine._block(call.block), adapter_for(model).token_jacobian
            with torch.no_grad():
                result["parts"] = {
                    "token_jacobian": _seconds(
                        lambda c=call, b=block, s=spec: token_jacobian(c, b, s)
                    ),
                    "guard's value": _seconds(
                        lambda e=engine, t=last: e._expected(1, t, torch.float32)
                    ),
                }
            activities = [ProfilerActivity.CPU] + (
                [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
            )
            with profile(activities=activities, record_shapes=True) as prof:
                engine.diagonal(1, last)
                sync()
    for key in ("self_device_time_total", "self_cpu_time_total"):
        events = sorted(
            prof.key_averages(group_by_input_shape=True), key=lambda e: getattr(e, key),
            reverse=True,
        )[:6]  # fmt: skip
        result[f"costliest ops ({key}, ms)"] = {
            f"{e.key} {e.input_shapes} x{e.count}": round(getattr(e, key) / 1e3, 1) for e in events
        }
    result["paths"] = {"composed": engine.composed, "autograd": engine.not_composed,
                       "fallbacks": engine.fallbacks}  # fmt: skip
    return result


# ---------------------------------------------------------------- 4-5. the rates' pieces


def vjp_path(model: nn.Module, vocab: int, tokens: int, device: str, blocks: int) -> dict:
    """Seconds of ``blocks`` depth-wise ``J_tt`` by d one-token VJPs (no composition)."""
    engine = JacobianEngine(model, {"input_ids": prompt_ids(vocab, tokens, 1, device)}, 64)
    engine._composed = lambda layer, t: None  # the VJP path, as for GPT-NeoX
    last = engine.n_tokens - 1
    with matmul_precision(False):
        engine.diagonal(1, last)  # warm-up
        sync()
        began = time.perf_counter()
        for layer in range(1, blocks + 1):
            engine.diagonal(layer, last)
        sync()
    return {"blocks": blocks, "seconds per block": (time.perf_counter() - began) / blocks}


def svd_step(model: nn.Module, shape: dict[str, int], tokens: int, device: str) -> dict:
    """Dense SVD and top-K of one trained-like and one random-init block Jacobian."""
    ids = prompt_ids(shape["vocab"], tokens, 1, device)
    one = {**shape, "layers": 1}
    random = depth_speed.random_llama(
        one["d"], 1, heads=one["heads"], vocab=one["vocab"], intermediate=one["intermediate"],
        kv_heads=one["kv_heads"], device=device, dtype=torch.bfloat16,
    )  # fmt: skip
    result = {}
    for name, built in (("trained-like", model), ("random-init", random)):
        jac = trained_like.depth_jacobians(built, ids, layers=1)
        with matmul_precision(False):
            spectral.svd(jac), spectral.randomized_top_k(jac, 50, PAPER.svd)  # first-call costs
            dense = _seconds(lambda jac=jac: spectral.svd(jac))
            values = _seconds(lambda jac=jac: spectral.singular_values(jac))
            counts: Counter[str] = Counter()
            top = _seconds(
                lambda jac=jac, counts=counts: spectral.randomized_top_k(jac, 50, PAPER.svd, counts)
            )
        result[name] = {"dense": dense, "svdvals": values, "top-K": top, "path": dict(counts)}
    del random
    return result


def _seconds(function: Callable[[], Any]) -> float:
    sync()
    began = time.perf_counter()
    function()
    sync()
    return round(time.perf_counter() - began, 4)


# ---------------------------------------------------------------- 6. rates and the planner


def measured_rates(results: dict[str, Any], shape: dict[str, int], device: str) -> cost.Rates:
    """``cost.Rates`` from the steps' results, under the cost model's own counts; what a step
    did not measure keeps ``cost.GPU``'s value."""
    d, layers, k = shape["d"], shape["layers"], PAPER.k_max
    p = cost.Shape(layers, d, _block_params(shape) * layers, 2).block_params
    rates = asdict(cost.GPU)
    depth = results.get("depth-wise", {}).get("split", {})
    full = results.get("full spectra", {}).get("split", {})
    n = results.get("depth-wise", {}).get("tokens", 128)
    vjp = results.get("vjp", {}).get("seconds per block")
    if vjp:
        rates["matmul"] = (d * 3.0 * (2.0 * p + 4.0 * n * d) + 2.0 * p * n) / vjp
    if depth.get("svd"):
        rates["topk"] = depth["svd"] / (layers * d**2 * (k + PAPER.svd.oversample))
    if full.get("svd", 0) > depth.get("svd", 0) > 0:
        rates["svdvals"] = (full["svd"] - depth["svd"]) / (layers * d**3)
    one = results.get("svd", {}).get("trained-like", {})  # one block's J, after a warm-up
    if one.get("dense"):
        rates["dense_svd"] = one["dense"] / d**3
    if one.get("svdvals") and "svdvals" not in full:
        rates["svdvals"] = one["svdvals"] / d**3
    overhead = results.get("full_loads", {}).get("device_map auto", {}).get("load seconds")
    imports = results.get("imports", {}).get("seconds")
    if overhead and imports:
        rates["overhead"] = overhead + imports
    info = results.get("environment", {})
    rates["name"] = (
        f"GPU, float32 (measured on an {info.get('device', device)} by "
        f"bench/gpu_acceptance.py, {info.get('date', '')})"
    )
    return cost.Rates(**rates)


def _block_params(shape: dict[str, int]) -> float:
    d, heads, kv = shape["d"], shape["heads"], shape["kv_heads"]
    return 2.0 * d * d + 2.0 * d * d * kv / heads + 3.0 * d * shape["intermediate"]


def planner(rates: cost.Rates, out: Path) -> dict[str, Any]:
    """The rates written as ``cost.load_rates`` reads them, and the paper suite's GPU-hours."""
    path = out / "gpu_rates.json"
    cost.write_rates(rates, path, {"script": "bench/gpu_acceptance.py"})
    try:
        from blockcoupling.cli.config_commands import load_plan

        plan = load_plan(ROOT / "config" / "paper.yaml", ROOT, check_memory=False)
    except ImportError as error:  # a GPU image without the workflow's packages
        return {
            "rates": asdict(rates),
            "paper suite GPU-hours": f"not computed here ({error}): run bench/gpu_acceptance.py "
            "--from-results OUT/acceptance.json where the workflow is installed",
            "file": str(path),
        }
    hours = {}
    for name, gpu in (("before", cost.GPU), ("after", cost.load_rates(path))):
        rows = cost.plan_costs(plan, gpu=gpu)
        hours[name] = round(sum(r.seconds for r in rows if r.on_gpu) / 3600, 1)
    return {"rates": asdict(rates), "paper suite GPU-hours": hours, "file": str(path)}


# ---------------------------------------------------------------- 7-8. saved models, loaded


def save_blocks(model: nn.Module, layers: int, folder: Path) -> Path:
    """The model's first ``layers`` blocks (embeddings, norm and head kept) saved in bfloat16."""
    import transformers

    config = transformers.LlamaConfig.from_dict(model.config.to_dict())
    config.num_hidden_layers = layers
    state = {
        key: value
        for key, value in model.state_dict().items()
        if not key.startswith("model.layers.") or int(key.split(".")[2]) < layers
    }
    with torch.device("meta"):
        shell = transformers.LlamaForCausalLM(config)
    shell.load_state_dict(state, assign=True)
    shell.to(torch.bfloat16).save_pretrained(folder)
    word_tokenizer(config.vocab_size).save_pretrained(folder)
    return folder


def word_tokenizer(vocab: int) -> Any:
    """A word-level tokenizer of ``vocab`` words ``t0 t1 ...`` (no hub here: ``load_model``
    loads a folder's tokenizer with its model)."""
    import tokenizers
    import transformers

    words = tokenizers.models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0")
    backend = tokenizers.Tokenizer(words)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0")


def load_options(kind: str, device: str) -> LoadOptions:
    """The load options of a ``kind`` (bfloat16, device_map auto, 4bit, 8bit)."""
    quantization = {"4bit": "4bit", "8bit": "8bit"}.get(kind)
    device_map = "auto" if kind == "device_map auto" else None
    return LoadOptions(dtype="bfloat16", device=device, quantization=quantization,
                       device_map=device_map)  # fmt: skip


def float32_twin(model: nn.Module) -> nn.Module:
    """A float32 ``LlamaForCausalLM`` carrying ``model``'s weights, bitsandbytes layers
    dequantized as the engine's compute copy holds them (``capture.compute_block``: transformers'
    ``dequantize_bnb_weight``), on ``model``'s first device: what is checked independently is
    the Jacobian, by autograd inside the twin's full forward."""
    import transformers

    from blockcoupling.jacobians.capture import compute_block

    device = next(model.parameters()).device
    config = transformers.LlamaConfig.from_dict(model.config.to_dict())
    config.quantization_config = None
    with torch.device(device):
        twin = transformers.LlamaForCausalLM._from_config(
            config, dtype=torch.float32, attn_implementation="eager"
        )
    twin.model.embed_tokens.weight.data.copy_(model.model.embed_tokens.weight.float())
    twin.model.norm.weight.data.copy_(model.model.norm.weight.float())
    for mine, theirs in zip(blocks_of(twin), blocks_of(model)):
        mine.load_state_dict(compute_block(theirs, torch.float32).state_dict())
    return twin.eval()


def reference_jacobians(
    twin: nn.Module, model: nn.Module, ids: torch.Tensor, layer: int, rows: int
) -> torch.Tensor:
    """``J_tt (d, d)`` of block ``layer`` at the last token by autograd inside a full forward of
    ``twin`` (float32), its block fed ``model``'s own input and position embeddings there
    (recorded by hooks on ``model``'s plain forward, no KV cache)."""
    recorded: dict[str, Any] = {}

    def record(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        recorded["x"] = hidden.detach().float()
        recorded["position_embeddings"] = tuple(
            p.detach().float() for p in kwargs["position_embeddings"]
        )

    handle = blocks_of(model)[layer - 1].register_forward_pre_hook(record, with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    handle.remove()
    x = recorded["x"].clone().requires_grad_(True)
    out: dict[str, torch.Tensor] = {}

    def substitute(_module: nn.Module, args: tuple, kwargs: dict) -> tuple:
        kwargs = {**kwargs, "position_embeddings": recorded["position_embeddings"]}
        if args:
            return (x, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": x}

    def capture(_module: nn.Module, _args: tuple, output: Any) -> None:
        out["y"] = output[0] if isinstance(output, tuple) else output

    block = blocks_of(twin)[layer - 1]
    hooks = [
        block.register_forward_pre_hook(substitute, with_kwargs=True),
        block.register_forward_hook(capture),
    ]
    try:
        with torch.enable_grad(), matmul_precision(False):
            twin(input_ids=ids, use_cache=False)
            residual = out["y"][0, -1] - x[0, -1]  # f(x)_t, the skip path excluded (d,)
            d = residual.shape[0]
            eye = torch.eye(d, device=x.device)
            jac = torch.empty(d, d, device=x.device)
            for start in range(0, d, rows):
                (grads,) = torch.autograd.grad(
                    residual, x, eye[start : start + rows], retain_graph=True,
                    is_grads_batched=True,
                )  # fmt: skip
                jac[start : start + rows] = grads[:, 0, -1]
    finally:
        for hook in hooks:
            hook.remove()
    return jac


def jacobian_check(folder: Path, kind: str, device: str, ids: torch.Tensor, rows: int) -> dict:
    """``measure``'s engine against the float32 twin's autograd, every block of ``folder``:
    the full-sequence VJPs (float32 throughout: to float32 rounding) and the depth-wise
    ``J_tt`` as ``measure`` takes it (its prefix keys and values as the model computed them, in
    bfloat16: to the guard's tolerance, twice bfloat16's epsilon)."""
    began = time.perf_counter()
    model, _ = load_model(ModelSource("path", str(folder)), load_options(kind, device))
    loaded = time.perf_counter() - began
    engine = JacobianEngine(model, {"input_ids": ids}, 64, allow_full_sequence=True)  # 16 tokens
    twin = float32_twin(model)
    last = engine.n_tokens - 1
    full, diagonal = [], []
    with matmul_precision(False):
        for layer in range(1, len(blocks_of(model)) + 1):
            reference = reference_jacobians(twin, model, ids, layer, rows)
            for errors, ours in (
                (full, engine.output_token(layer, last)[last]),
                (diagonal, engine.diagonal(layer, last)),
            ):
                errors.append(float((ours - reference).norm() / reference.norm()))
    linear = type(next(m for m in blocks_of(model)[0].modules() if "Linear" in type(m).__name__))
    bound = 2 * torch.finfo(torch.bfloat16).eps
    return {
        "load seconds": round(loaded, 2),
        "linear layers": linear.__name__,
        "full-sequence VJPs, relative error per block": [f"{e:.2e}" for e in full],
        "depth-wise J_tt, relative error per block": [f"{e:.2e}" for e in diagonal],
        "passed": max(full) < 1e-4 and max(diagonal) < bound,
        "paths": {"composed": engine.composed, "autograd": engine.not_composed - engine.fallbacks,
                  "full sequence": engine.fallbacks,
                  "refusals": [r.describe() for r in engine.refused]},
    }  # fmt: skip


def loads(model: nn.Module, shape: dict, device: str, dry_run: bool, scratch: Path) -> dict:
    """Step 7: the two-block model in each load kind, checked against its float32 twin."""
    folder = save_blocks(model, 2, scratch / "two_blocks")
    ids = prompt_ids(shape["vocab"], 16, 3, device)
    kinds = ["bfloat16", "device_map auto"] + ([] if dry_run else ["4bit", "8bit"])
    result = {}
    for kind in kinds:
        try:
            result[kind] = jacobian_check(folder, kind, device, ids, 256 if not dry_run else 64)
        except Exception as error:  # noqa: BLE001 (one kind's failure is its result)
            result[kind] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
        free_device_memory()
    if dry_run:
        result["4bit, 8bit"] = "left out on the CPU (bitsandbytes' quantized layers need CUDA)"
    shutil.rmtree(folder)
    return result


def full_loads(
    model: nn.Module, shape: dict, tokens: int, device: str, dry_run: bool, scratch: Path
) -> dict:
    """Step 8: the whole model saved, loaded each way, one depth-wise prompt each."""
    folder = scratch / "whole"
    began = time.perf_counter()
    save_blocks(model, shape["layers"], folder)
    result: dict[str, Any] = {"save seconds": round(time.perf_counter() - began, 2)}
    ids = prompt_ids(shape["vocab"], tokens, 1, device)
    built = coupling_dataset(PROMPT_DATA["built"]["depth"], METRICS)["depth_mis"].values
    for kind in ["device_map auto"] + ([] if dry_run else ["4bit", "8bit"]):
        try:
            free_device_memory()
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            began = time.perf_counter()
            loaded, _ = load_model(ModelSource("path", str(folder)), load_options(kind, device))
            sync()
            seconds = time.perf_counter() - began
            memory = gib(torch.cuda.memory_allocated()) if torch.cuda.is_available() else None
            timing, data = timed_prompt(loaded, ids, replace(PAPER, max_tokens=tokens))
            mis = coupling_dataset(data["depth"], METRICS)["depth_mis"].values
            result[kind] = {
                "load seconds": round(seconds, 2),
                "weights GiB": memory,
                "peak GiB": peak_memory_gib(),
                "prompt": timing,
                "largest |m_K - built model's|": float(np.nanmax(np.abs(mis - built))),
            }
            del loaded
        except Exception as error:  # noqa: BLE001 (one kind's failure is its result)
            result[kind] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
    shutil.rmtree(folder)
    return result


def import_seconds() -> dict[str, Any]:
    """A job's start: a fresh Python importing the extraction's modules."""
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import torch, transformers, blockcoupling.jacobians.extract"],
        check=True, env={**os.environ, "PYTHONPATH": python_path()},
    )  # fmt: skip
    return {"seconds": round(time.perf_counter() - began, 2)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_out")))
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="seconds after which no step starts"
    )
    parser.add_argument("--tokens", type=int, default=None, help="default 128 (dry run: 8)")
    parser.add_argument(
        "--width",
        type=int,
        help="a proxy of Llama-3-8B's proportions at this width (heads of 128, a quarter as many "
        "key-value heads, MLP 3.5 d, vocabulary 32,000) instead of its shape",
    )
    parser.add_argument("--layers", type=int, help="blocks of the --width proxy (default 32)")
    parser.add_argument("--dry-run", action="store_true", help="tiny shape on the CPU")
    parser.add_argument("--skip", nargs="*", default=[], help="steps to leave out")
    parser.add_argument(
        "--from-results",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="no steps: the rates and planner from saved acceptance.json files (later override)",
    )
    args = parser.parse_args(argv)
    if args.from_results:
        results: dict[str, Any] = {}
        for path in args.from_results:
            results.update(json.loads(path.read_text()))
        args.out.mkdir(parents=True, exist_ok=True)
        results["rates"] = planner(
            measured_rates(results, trained_like.LLAMA3_8B, "cuda"), args.out
        )
        print(json.dumps(results["rates"], indent=1))
        return results
    device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run on a GPU, or --dry-run on the CPU")
    shape = TINY if args.dry_run else trained_like.LLAMA3_8B
    if args.width:
        heads = max(1, args.width // 128)
        shape = {"d": args.width, "layers": args.layers or 32, "heads": heads,
                 "kv_heads": max(1, heads // 4), "intermediate": int(3.5 * args.width),
                 "vocab": 32000}  # fmt: skip
    tokens = args.tokens or (8 if args.dry_run else 128)
    run = Run(args.out, args.budget_s, device)
    run.record("environment", environment(device))
    model, seconds = build(shape, device, torch.bfloat16)
    run.record("build", {"seconds": round(seconds, 2), "shape": shape, "alpha": trained_like.ALPHA,
                         "parameters": sum(p.numel() for p in model.parameters())})  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix="acceptance-"))
    vocab = shape["vocab"]
    # (name, step, seconds of the budget it needs left, its own limit): the measured H100 seconds
    # of each (bench/runs/gpu_acceptance_h100.md) with room; the sum of the limits that run in a
    # full budget stays inside 8 minutes of device time with the build and the imports
    steps: list[tuple[str, Callable[[], dict[str, Any]], float, int]] = [
        ("paths", lambda: paths(model, vocab, tokens, device), 30, 60),
        ("fd", lambda: finite_differences(device, args.dry_run), 70, 80),
        ("imports", import_seconds, 10, 30),
        ("composition", lambda: composition_profile(model, vocab, tokens, device), 10, 30),
        ("first", lambda: prompts(model, vocab, tokens, device, "first"), 20, 40),
        ("depth-wise", lambda: prompts(model, vocab, tokens, device, "depth-wise"), 15, 30),
        ("vjp", lambda: vjp_path(model, vocab, tokens, device, 2), 5, 15),
        ("svd", lambda: svd_step(model, shape, tokens, device), 15, 25),
        ("rates", lambda: planner(measured_rates(run.results, shape, device), args.out), 5, 20),
        ("loads", lambda: loads(model, shape, device, args.dry_run, scratch), 45, 60),
        ("full spectra", lambda: prompts(model, vocab, tokens, device, "full spectra"), 50, 60),
        ("full_loads", lambda: full_loads(model, shape, tokens, device, args.dry_run, scratch),
         120, 150),
        ("rates", lambda: planner(measured_rates(run.results, shape, device), args.out), 5, 20),
    ]  # fmt: skip
    for name, function, needs, limit in steps:
        if name not in args.skip:
            run.step(name, function, needs, limit)
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"done in {run.elapsed():.0f} s; results in {args.out / 'acceptance.json'}")
    return run.results


if __name__ == "__main__":
    main()
