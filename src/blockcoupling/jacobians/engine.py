"""Block Jacobians ``J^l_{t1 t2} = d f^l(X^{l-1})_{t2} / d x^{l-1}_{t1}`` by batched VJPs and JVPs.

One batch of d vector-Jacobian products of output token t2 gives ``J_{t1 t2}`` for every input
token t1 <= t2 at once. For causal models the block is re-invoked on the prefix of tokens <= t2
only (re-recorded from a forward pass of that prefix), so nothing is computed for t1 > t2. One
batch of d Jacobian-vector products of input token t1 gives ``J_{t1 t2}`` for every output token.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from blockcoupling.jacobians.adapters import adapter_for
from blockcoupling.jacobians.capture import (
    BlockCall,
    accepts_use_cache,
    block_device,
    compute_block,
    compute_dtype,
    record_calls,
    record_token_calls,
    residual_function,
)
from blockcoupling.jacobians.options import auto_chunk
from blockcoupling.jacobians.token_jacobian import NotComposable, token_jacobian


class NonFiniteJacobianError(FloatingPointError, ValueError):
    """A Jacobian with NaN or inf entries: a property of the model's weights or activations, so
    a user error (a ``ValueError``: one line from the CLI and the rules, not a traceback).
    """

    def __init__(self, where: str):
        super().__init__(
            f"non-finite Jacobian (NaN/inf) at {where}; check the weights for NaN/inf or huge "
            "values (a damaged or diverged checkpoint) and the dtype (float16 overflows: load it "
            "in float32)"
        )


def _one_hot_vectors(x: torch.Tensor, t: int) -> torch.Tensor:
    """The d one-hot vectors of token ``t`` in the shape of ``x (token, d)``: ``(d, token, d)``."""
    n, d = x.shape
    vectors = torch.zeros(d, n, d, dtype=x.dtype, device=x.device)
    vectors[:, t, :] = torch.eye(d, dtype=x.dtype, device=x.device)
    return vectors


def output_token_jacobians(
    residual: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    t2: int,
    chunk_size: int | None = None,
    on_fallback: Callable[[], None] | None = None,
) -> torch.Tensor:
    """All ``J_{t1 t2}`` for one output token: ``(token, d_out, d_in)`` (t1 = 0..n-1 of ``x``).

    ``x``: the block input ``(token, d)``; ``residual``: ``f(x) = block(x) - x``. Uses one
    ``torch.func.vjp`` and ``vmap`` over the d one-hot cotangents of token t2, ``chunk_size`` of
    them at a time (None: all at once). Blocks that ``torch.func`` refuses (a custom
    ``autograd.Function`` without ``setup_context``, such as BLOOM's GeLU) fall back to a plain
    loop of d ``torch.autograd.grad`` VJPs; ``on_fallback`` is called when that happens.
    """
    cotangents = _one_hot_vectors(x, t2)
    try:
        with torch.no_grad():  # torch.func differentiates w.r.t. x; no graph w.r.t. the weights
            _, vjp_fn = torch.func.vjp(residual, x)
            (rows,) = torch.func.vmap(vjp_fn, chunk_size=chunk_size)(cotangents)
    except (RuntimeError, NotImplementedError):
        if on_fallback is not None:
            on_fallback()
        rows = _products_by_backward(residual, x, cotangents)
    return rows.permute(1, 0, 2)  # (d_out, token, d_in) -> (token, d_out, d_in)


def _products_by_backward(
    residual: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, cotangents: torch.Tensor
) -> torch.Tensor:
    """``J^T u`` for each cotangent ``u`` of ``cotangents (m, token, d)``, one backward pass
    each: ``(m, token, d)``.
    """
    with torch.enable_grad():
        inputs = x.detach().requires_grad_(True)
        output = residual(inputs)
        rows = [
            torch.autograd.grad(output, inputs, cotangent, retain_graph=True)[0]
            for cotangent in cotangents
        ]
    return torch.stack(rows).detach()


def input_token_jacobians(
    residual: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    t1: int,
    chunk_size: int | None = None,
    on_fallback: Callable[[], None] | None = None,
) -> torch.Tensor:
    """All ``J_{t1 t2}`` for one input token: ``(token, d_out, d_in)`` (t2 = 0..n-1 of ``x``).

    One batch of d Jacobian-vector products with one-hot tangents at token t1 (forward mode,
    ``chunk_size`` at a time): each gives a column of ``J_{t1 t2}`` for every output token t2.
    """
    tangents = _one_hot_vectors(x, t1)
    columns = input_token_products(residual, x, tangents, chunk_size, on_fallback)
    return columns.permute(1, 2, 0)  # (d_in, token, d_out) -> (token, d_out, d_in)


def input_token_products(
    residual: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    tangents: torch.Tensor,
    chunk_size: int | None = None,
    on_fallback: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Jacobian-vector products ``J v`` of ``residual`` at ``x (token, d)`` for every tangent of
    ``tangents (m, token, d)``: ``(m, token, d)``.

    Forward mode (``torch.func.jvp``, vmapped ``chunk_size`` tangents at a time). Blocks whose
    functions have no forward rule, or that ``torch.func`` refuses, fall back to the
    double-backward identity ``J v = d/du <J^T u, v>``; ``on_fallback`` is called when that
    happens.
    """
    try:
        with torch.no_grad():
            return torch.func.vmap(
                lambda v: torch.func.jvp(residual, (x,), (v,))[1], chunk_size=chunk_size
            )(tangents)
    except (RuntimeError, NotImplementedError):
        if on_fallback is not None:
            on_fallback()
        return _products_by_double_backward(residual, x, tangents)


def _products_by_double_backward(
    residual: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tangents: torch.Tensor
) -> torch.Tensor:
    """``J v`` for each tangent ``(m, token, d)`` via ``d/du <J^T u, v>`` (reverse over reverse)."""
    with torch.enable_grad():
        inputs = x.detach().requires_grad_(True)
        output = residual(inputs)
        dual = torch.zeros_like(output, requires_grad=True)
        (pullback,) = torch.autograd.grad(output, inputs, dual, create_graph=True)
        rows = [
            torch.autograd.grad(pullback, dual, tangent, retain_graph=True)[0]
            for tangent in tangents
        ]
    return torch.stack(rows).detach()


@dataclass(frozen=True)
class Request:
    """One wanted Jacobian: block ``layer`` (1-based), input token ``t1``, output token ``t2``."""

    layer: int
    t1: int
    t2: int


def validate_requests(
    requests: Iterable[Request], n_layers: int, n_tokens: int, causal: bool
) -> list[Request]:
    """Check layer and token ranges (and t1 <= t2 for causal models); one clear error each."""
    checked = list(requests)
    for r in checked:
        if not 1 <= r.layer <= n_layers:
            raise ValueError(f"layer {r.layer} is outside 1..{n_layers}")
        for name, t in (("t1", r.t1), ("t2", r.t2)):
            if not 0 <= t < n_tokens:
                raise ValueError(f"{name}={t} is outside the prompt's tokens 0..{n_tokens - 1}")
        if causal and r.t1 > r.t2:
            raise ValueError(
                f"t1={r.t1} > t2={r.t2}: the Jacobian is zero by causality (input after output); "
                "not computed"
            )
    return checked


def _finite(
    jac: torch.Tensor,
    layer: int,
    fixed: str,
    stacked: str = "t1",
    first: int = 0,
    label: str = "",
) -> torch.Tensor:
    """``jac (token, d, d)`` unchanged, or an error naming ``label`` (model and prompt), the
    layer, the fixed token (``fixed``, e.g. ``'t2=5'``) and the tokens ``stacked`` along the
    first axis (``first``: that of ``jac[0]``) that hold non-finite entries.
    """
    if not torch.isfinite(jac).all():
        bad = sorted({first + int(t) for t in torch.nonzero(~torch.isfinite(jac))[:, 0]})
        where = f"{label + ', ' if label else ''}layer {layer}, {fixed}, {stacked} in {bad}"
        raise NonFiniteJacobianError(where)
    return jac


COMPOSED, AUTOGRAD, FULL_SEQUENCE = "composed", "single-token autograd", "full sequence"
METHODS = (COMPOSED, AUTOGRAD, FULL_SEQUENCE)  # how a J_tt was taken, fastest first
FULL_SEQUENCE_KEY = "extract.allow_full_sequence"
WATCHDOG_FACTOR = 5.0  # a block slower than this times its FLOP-predicted seconds is logged
WATCHDOG_FLOOR_S = 1.0  # ... and slower than this (shorter blocks: timer and Python overhead)
log = logging.getLogger("blockcoupling")


def is_accelerator(device: torch.device) -> bool:
    """Whether ``device`` is an accelerator (anything but the CPU): there the full-sequence
    ``J_tt`` (~t times the single-token cost) needs ``extract.allow_full_sequence``, and the
    single-token paths are chosen by timing them.
    """
    return device.type != "cpu"


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA), so that a clock read after it counts it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _storage_tolerance(block: nn.Module) -> float:
    """Relative tolerance of the single-token call against the full pass, both re-invoked in the
    compute dtype at the same input: what is left between them is the prefix KV cache, stored in
    the model's dtype (measured 5.6e-3 for bfloat16 at block 1 of a trained-like Llama, 2e-4
    from block 2 on). 1e-8 in float64, 1e-3 in float32, twice the storage precision for
    half-precision models (1.6e-2 for bfloat16, 2e-3 for float16); 1e-2 at least where CUDA's
    float32 matmuls run in TensorFloat-32.
    """
    dtype = compute_dtype(block)
    if dtype == torch.float64:
        return 1e-8
    storage = [p.dtype for p in block.parameters() if p.is_floating_point()]
    floor = 1e-2 if _tf32(block_device(block)) else 1e-3
    return max([floor] + [2 * torch.finfo(d).eps for d in storage])


def _compute_tolerance(dtype: torch.dtype, device: torch.device) -> float:
    """Relative tolerance of the composition's value against the re-invoked single-token block:
    the same function of the same input in the same dtype, so only rounding is left: 1e-10 in
    float64, 1e-4 in float32 (measured ~1e-6), 1e-2 in TensorFloat-32.
    """
    if dtype == torch.float64:
        return 1e-10
    return 1e-2 if _tf32(device) else 1e-4


def _tf32(device: torch.device) -> bool:
    """Whether CUDA's float32 matmuls on ``device`` run in TensorFloat-32."""
    return device.type == "cuda" and torch.backends.cuda.matmul.fp32_precision == "tf32"


def _difference(value: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative 2-norm difference of ``value`` from ``expected`` (NaN when either is not finite)."""
    return float((value - expected).norm()) / max(float(expected.norm()), 1e-12)


def _first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


@dataclass(frozen=True)
class Refusal:
    """Why block ``layer``'s single-token ``J_tt`` at token ``t`` was not taken by ``path``
    (``recording``, ``composition``, ``single-token call``): an error's first line, or the
    guard's disagreement with its measured relative ``difference`` and ``tolerance``.
    """

    layer: int
    t: int
    path: str
    reason: str
    difference: float | None = None
    tolerance: float | None = None

    def describe(self) -> str:
        """``path: reason`` and, for a disagreement, ``(difference d > tolerance e)``."""
        if self.difference is None:
            return f"{self.path}: {self.reason}"
        return (
            f"{self.path}: {self.reason} (difference {self.difference:.2e} > tolerance "
            f"{self.tolerance:.2e})"
        )


class FullSequenceRefused(ValueError):
    """A single-token ``J_tt`` refused on an accelerator without ``extract.allow_full_sequence``:
    the full-sequence path would cost ~t times the plan (a ``ValueError``: one line).
    """

    def __init__(self, where: str, refusals: list[Refusal]):
        reasons = "; ".join(r.describe() for r in refusals) or "no reason recorded"
        super().__init__(
            f"{where}: the single-token J_tt was refused ({reasons}); the full-sequence path "
            f"costs ~t times as much on an accelerator: set {FULL_SEQUENCE_KEY}: true "
            "(blockcoupling measure: --allow-full-sequence) to take it, or run on the CPU"
        )


@dataclass
class MethodChoice:
    """The single-token path a model's blocks take, shared by its prompts' engines, and the
    watchdog's rate. ``select``: time each exact path on the first block where both pass their
    guards (warm, synchronized) and keep the fastest (the composition unless the autograd path
    takes under ``margin`` of its time); off, the composition is taken wherever it passes.
    ``method``: the choice once made; ``seconds``: each path's timed seconds then;
    ``seconds_per_flop``: calibrated on the first timed block, per method.
    """

    select: bool = False
    margin: float = 0.8
    method: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    seconds_per_flop: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _TokenCall:
    """A single-token call at the full pass's input that passed the guard: the call, its
    residual function in the compute dtype, its input ``x (1, d)`` and value ``f(x)_t (d,)``.
    """

    call: BlockCall
    residual: Callable[[torch.Tensor], torch.Tensor]
    x: torch.Tensor
    value: torch.Tensor


class JacobianEngine:
    """Jacobians of one prompt's blocks. ``inputs``: the model inputs of the prompt, batch 1,
    e.g. ``{'input_ids': (1, token)}``. Recorded calls of each prefix are cached. ``label``
    (e.g. ``"model gpt2, prompt p0003"``) names the prompt in errors. ``choice``: how the
    single-token path is chosen, shared across a model's prompts (default: the composition
    wherever it passes, no timing); ``allow_full_sequence``: whether a refused single-token
    ``J_tt`` may take the full-sequence path on an accelerator (on the CPU it always may).
    """

    def __init__(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        chunk_size: int | None = None,
        label: str = "",
        choice: MethodChoice | None = None,
        allow_full_sequence: bool = False,
    ):
        self.model = model
        self.label = label
        self.inputs = inputs
        self.chunk_size = chunk_size
        self.choice = choice if choice is not None else MethodChoice()
        self.allow_full_sequence = allow_full_sequence
        self.causal = adapter_for(model).causal
        self._calls: dict[int, list[BlockCall]] = {}
        self._token_calls: dict[int, list[BlockCall] | None] = {}
        self._recording_errors: dict[int, str] = {}
        self._checked: tuple[tuple[int, int] | None, _TokenCall | None] = (None, None)
        self.full = record_calls(model, **inputs)
        self.n_tokens = int(self.full[0].input.shape[0])  # tokens as the blocks see them
        self._calls[self.n_tokens] = self.full
        self.methods: Counter[tuple[int, str]] = Counter()  # (layer, method) -> J_tt taken by it
        self.refused: list[Refusal] = []  # every refused single-token path, in order
        self.slow: list[str] = []  # the watchdog's lines
        self.loop_fallbacks = 0  # VJP/JVP batches torch.func refused: plain autograd loops
        self._compute_block: tuple[nn.Module | None, nn.Module | None] = (None, None)

    def _count(self, method: str) -> int:
        return sum(n for (_, m), n in self.methods.items() if m == method)

    @property
    def composed(self) -> int:
        """Diagonal Jacobians composed from the weights (``token_jacobian``)."""
        return self._count(COMPOSED)

    @property
    def not_composed(self) -> int:
        """Diagonal Jacobians by autograd: the single-token call or the full sequence."""
        return self._count(AUTOGRAD) + self._count(FULL_SEQUENCE)

    @property
    def fallbacks(self) -> int:
        """Diagonal Jacobians that took the full-sequence path."""
        return self._count(FULL_SEQUENCE)

    @property
    def refusals(self) -> Counter[str]:
        """How often each reason refused a single-token path."""
        return Counter(f"{r.path}: {r.reason}" for r in self.refused)

    def _refuse(
        self,
        layer: int,
        t: int,
        path: str,
        reason: str,
        difference: float | None = None,
        tolerance: float | None = None,
    ) -> None:
        self.refused.append(Refusal(layer, t, path, reason, difference, tolerance))

    def _count_loop_fallback(self) -> None:
        self.loop_fallbacks += 1

    def _chunk(self, x: torch.Tensor, attended: int | None = None) -> int:
        """VJPs/JVPs per vmapped batch for an input ``x (token, d)`` whose block attends to
        ``attended`` tokens (default: those of ``x``): ``chunk_size``, or ``options.auto_chunk``
        (for ``x``'s device) when it is None.
        """
        n_tokens = x.shape[0] if attended is None else attended
        return self.chunk_size or auto_chunk(n_tokens, x.shape[-1], x.device.type == "cpu")

    def _block(self, block: nn.Module) -> nn.Module:
        """The compute copy of ``block``, kept for the next call on the same block (one copy
        alive at a time: a half-precision or quantized model never holds more than one float32
        block).
        """
        if self._compute_block[0] is not block:
            self._compute_block = (None, None)  # free the previous copy first
            self._compute_block = (block, compute_block(block, compute_dtype(block)))
        return self._compute_block[1]

    def _residual(self, call: BlockCall) -> Callable[[torch.Tensor], torch.Tensor]:
        """``residual_function(call)`` on the kept compute copy of its block."""
        return residual_function(call, self._block(call.block))

    def calls_for(self, length: int) -> list[BlockCall]:
        """Recorded block calls of the prompt's first ``length`` tokens (a causal prefix of the
        sequence inputs; non-causal models and image inputs have only the full sequence).
        """
        if length not in self._calls:
            if not self.causal or "input_ids" not in self.inputs:
                raise ValueError(f"no prefix of {length} tokens: only causal text models have them")
            prefix = {k: v[:, :length] for k, v in self.inputs.items()}
            self._calls[length] = record_calls(self.model, **prefix)
        return self._calls[length]

    def output_token(self, layer: int, t2: int) -> torch.Tensor:
        """``J^layer_{t1 t2}`` for every t1 (``(t1, d, d)``, t1 = 0..t2 for causal models)."""
        length = t2 + 1 if self.causal and "input_ids" in self.inputs else self.n_tokens
        call = self.calls_for(length)[layer - 1]
        x = call.input.to(compute_dtype(call.block))
        jac = output_token_jacobians(
            self._residual(call), x, t2, self._chunk(x), self._count_loop_fallback
        )
        return _finite(jac, layer, f"t2={t2}", label=self.label)

    def input_token(self, layer: int, t1: int) -> torch.Tensor:
        """``J^layer_{t1 t2}`` for every t2 (``(t2, d, d)`` over the whole sequence; zero for
        t2 < t1 in causal models), from one batch of d JVPs at input token t1.
        """
        call = self.full[layer - 1]
        x = call.input.to(compute_dtype(call.block))
        jac = input_token_jacobians(
            self._residual(call), x, t1, self._chunk(x), self._count_loop_fallback
        )
        return _finite(jac, layer, f"t1={t1}", stacked="t2", label=self.label)

    def diagonal(self, layer: int, t: int) -> torch.Tensor:
        """``J^layer_{tt}`` ``(d, d)``. For causal models with a KV cache the block is taken on
        token t alone (at the full pass's input ``x_t``) with a snapshot of the cache of tokens
        < t: composed from its weights when the adapter table says how (``token_jacobian``),
        else re-invoked under autograd (~t times cheaper than the full sequence). Guards: the
        single-token call against the full pass, and the composition against the single-token
        call, each at the same input in the same dtype. A refused block takes the full-sequence
        path (``output_token``) on the CPU, and on an accelerator only with
        ``allow_full_sequence`` (else ``FullSequenceRefused``). Every block's method goes to
        ``methods``, every refusal to ``refused``; a block over ``WATCHDOG_FACTOR`` times its
        FLOP-predicted seconds is logged and kept in ``slow``.
        """
        self._token_calls_at(t)  # recorded once per token, outside the timed part
        device = self.full[layer - 1].input.device
        choosing = self.choice.select and self.choice.method is None
        synchronize(device)
        began = time.perf_counter()
        jac, method = self._diagonal(layer, t)
        synchronize(device)
        seconds = time.perf_counter() - began
        self.methods[(layer, method)] += 1
        if not (choosing and self.choice.method is not None):  # not the block timed twice
            self._watch(layer, t, method, seconds)
        return _finite(jac[None], layer, f"t2={t}", first=t, label=self.label)[0]

    def _diagonal(self, layer: int, t: int) -> tuple[torch.Tensor, str]:
        """``(J_tt, the method that took it)``."""
        if self.choice.method != AUTOGRAD:
            jac = self._composed(layer, t)
            if jac is not None:
                if self.choice.select and self.choice.method is None:
                    return self._select(layer, t, jac)
                return jac, COMPOSED
        checked = self._token_call(layer, t)
        if checked is not None:
            return self._autograd(checked, t), AUTOGRAD
        return self._full_sequence(layer, t), FULL_SEQUENCE

    def _autograd(self, checked: _TokenCall, t: int) -> torch.Tensor:
        """``J_tt`` by d VJPs through the re-invoked single-token block."""
        chunk = self._chunk(checked.x, attended=t + 1)
        return output_token_jacobians(
            checked.residual, checked.x, 0, chunk, self._count_loop_fallback
        )[0]

    def _full_sequence(self, layer: int, t: int) -> torch.Tensor:
        """``J_tt`` by d VJPs through the block on the whole prefix; on an accelerator only
        with ``allow_full_sequence``, or where no single-token path exists (non-causal models,
        models without a KV cache).
        """
        reasons = [r for r in self.refused if (r.layer, r.t) == (layer, t)]
        device = self.full[layer - 1].input.device
        if reasons and is_accelerator(device) and not self.allow_full_sequence:
            where = f"{self.label + ', ' if self.label else ''}block {layer}, token {t}"
            raise FullSequenceRefused(where, reasons)
        return self.output_token(layer, t)[t]

    def _select(self, layer: int, t: int, composed: torch.Tensor) -> tuple[torch.Tensor, str]:
        """Time the composition and the single-token autograd path on this block, each warm
        (this call's composition was the composition's warm-up) and synchronized, keep the
        fastest (the composition unless autograd takes under ``choice.margin`` of its time) and
        calibrate the watchdog's rate of each.
        """
        checked = self._token_call(layer, t)
        device = checked.x.device
        self._autograd(checked, t)  # warm-up
        timed = {
            COMPOSED: lambda: self._composed(layer, t),
            AUTOGRAD: lambda: self._autograd(checked, t),
        }
        for method, function in timed.items():
            synchronize(device)
            began = time.perf_counter()
            function()
            synchronize(device)
            self.choice.seconds[method] = time.perf_counter() - began
            flops = self._flops(layer, t, method)
            self.choice.seconds_per_flop[method] = self.choice.seconds[method] / flops
        faster = self.choice.seconds[AUTOGRAD] < self.choice.margin * self.choice.seconds[COMPOSED]
        self.choice.method = AUTOGRAD if faster else COMPOSED
        seconds = ", ".join(f"{m} {s:.4f} s" for m, s in self.choice.seconds.items())
        log.info("%s: J_tt by %s (block %d timed: %s)", self._who(), self.choice.method, layer,
                 seconds)  # fmt: skip
        if self.choice.method == AUTOGRAD:
            return self._autograd(checked, t), AUTOGRAD
        return composed, COMPOSED

    def _who(self) -> str:
        return self.label.split(", prompt")[0] or "the model"

    def _flops(self, layer: int, t: int, method: str) -> float:
        """FLOPs of one block's ``J_tt`` by ``method`` at token t (with its guard): the
        composition ``2 d P + 2 d^3``; d VJPs, each ~3 forwards, through one token
        (``3 d (2 P + 4 (t+1) d)``) or the whole prefix (``3 d (2 P + 4 (t+1) d) (t+1)``);
        the guard's full-sequence value ``2 P n``. ``P``: the block's parameters, ``d``: width.
        """
        block = self._block(self.full[layer - 1].block)
        p = float(sum(w.numel() for w in block.parameters()))
        d, n = float(self.full[layer - 1].input.shape[-1]), float(t + 1)
        guard = 2.0 * p * self.n_tokens
        if method == COMPOSED:
            return 2.0 * d * p + 2.0 * d**3 + guard
        one_token = 3.0 * d * (2.0 * p + 4.0 * n * d)
        return one_token + guard if method == AUTOGRAD else one_token * n

    def _watch(self, layer: int, t: int, method: str, seconds: float) -> None:
        """Calibrate the rate on the first timed block of a method (of any method when this one
        has none), then log a block over ``WATCHDOG_FACTOR`` times its FLOP-predicted seconds
        (and over ``WATCHDOG_FLOOR_S``).
        """
        rates = self.choice.seconds_per_flop
        flops = self._flops(layer, t, method)
        rate = rates.get(method) or next(iter(rates.values()), None)
        if rate is None:
            rates[method] = seconds / flops
            return
        predicted = flops * rate
        if seconds > max(WATCHDOG_FACTOR * predicted, WATCHDOG_FLOOR_S):
            line = (
                f"{self.label or 'the model'}, block {layer}: J_tt by {method} took "
                f"{seconds:.3f} s, over {WATCHDOG_FACTOR:g}x its FLOP-predicted {predicted:.3f} s"
            )
            self.slow.append(line)
            log.warning(line)
        rates.setdefault(method, seconds / flops)

    def _token_calls_at(self, t: int) -> list[BlockCall] | None:
        """Every block's single-token call at t (recorded once), or None without a KV cache or
        when the recording failed (its error kept for each block's refusal).
        """
        if not self.causal or "input_ids" not in self.inputs or not accepts_use_cache(self.model):
            return None
        if t not in self._token_calls:
            try:
                self._token_calls[t] = record_token_calls(self.model, self.inputs["input_ids"], t)
            except (RuntimeError, ValueError, TypeError, AttributeError) as error:
                self._recording_errors[t] = _first_line(error)
                self._token_calls[t] = None
        return self._token_calls[t]

    def _expected(self, layer: int, t: int, dtype: torch.dtype) -> torch.Tensor:
        """``f(x)_t`` of block ``layer`` in the full pass, in ``dtype``: ``(d,)``; as recorded
        when the block computes in ``dtype``, else re-invoked on the full sequence in it.
        """
        reference = self.full[layer - 1]
        if all(p.dtype == dtype for p in reference.block.parameters()):
            return reference.output[t] - reference.input[t]
        return self._residual(reference)(reference.input.to(dtype))[t]

    def _token_call(self, layer: int, t: int) -> _TokenCall | None:
        """Block ``layer``'s single-token call at t, set at the full pass's input ``x_t``, if
        its value there equals the full pass's (both in the compute dtype, the same input: only
        the prefix cache's storage differs; ``_storage_tolerance``); else None, the refusal
        recorded. Kept for the next call on the same block and token.
        """
        if self._checked[0] == (layer, t):
            return self._checked[1]
        self._checked = ((layer, t), self._check_token_call(layer, t))
        return self._checked[1]

    def _check_token_call(self, layer: int, t: int) -> _TokenCall | None:
        calls = self._token_calls_at(t)
        if calls is None:
            if t in self._recording_errors:
                self._refuse(layer, t, "recording", self._recording_errors[t])
            return None
        reference = self.full[layer - 1]
        call = replace(calls[layer - 1], input=reference.input[t : t + 1])
        dtype = compute_dtype(call.block)
        try:
            residual, x = self._residual(call), call.input.to(dtype)
            with torch.no_grad():
                value = residual(x)[0]
                expected = self._expected(layer, t, dtype)
        except (RuntimeError, ValueError, TypeError) as error:
            self._refuse(layer, t, "single-token call", _first_line(error))
            return None
        tolerance = _storage_tolerance(call.block)
        difference = _difference(value, expected)
        if not difference <= tolerance:
            reason = "its value differs from the full pass"
            self._refuse(layer, t, "single-token call", reason, difference, tolerance)
            return None
        return _TokenCall(call, residual, x, value)

    def _composed(self, layer: int, t: int) -> torch.Tensor | None:
        """``J_tt`` composed from the block's weights (``token_jacobian``) at the checked
        single-token call, if the adapter table has a composition for the architecture and its
        value equals the re-invoked block's there (same input, same dtype:
        ``_compute_tolerance``); else None, the refusal recorded.
        """
        spec = adapter_for(self.model).token_jacobian
        checked = self._token_call(layer, t) if spec is not None else None
        if checked is None:
            return None
        try:
            with torch.no_grad():
                jac, value = token_jacobian(checked.call, self._block(checked.call.block), spec)
        except (NotComposable, RuntimeError, ValueError, TypeError, AttributeError) as error:
            self._refuse(layer, t, "composition", _first_line(error))
            return None
        tolerance = _compute_tolerance(value.dtype, value.device)
        difference = _difference(value, checked.value)
        if not difference <= tolerance:
            reason = "its value differs from the re-invoked block"
            self._refuse(layer, t, "composition", reason, difference, tolerance)
            return None
        if not (torch.isfinite(value.square().sum()) and torch.isfinite(jac).all()):
            # overflowing values (huge weights): the composition and autograd overflow in other
            # places, so the reference path decides, and names the layer as non-finite
            self._refuse(layer, t, "composition", "a non-finite value or Jacobian")
            return None
        return jac

    def jacobians(self, requests: Iterable[Request]) -> dict[Request, torch.Tensor]:
        """The requested ``(d, d)`` Jacobians; one VJP batch per distinct (layer, t2)."""
        wanted = validate_requests(requests, len(self.full), self.n_tokens, self.causal)
        by_output: dict[tuple[int, int], list[Request]] = {}
        for r in wanted:
            by_output.setdefault((r.layer, r.t2), []).append(r)
        result: dict[Request, torch.Tensor] = {}
        for (layer, t2), group in by_output.items():
            jac = self.output_token(layer, t2)
            for r in group:
                result[r] = jac[r.t1]
        return result
