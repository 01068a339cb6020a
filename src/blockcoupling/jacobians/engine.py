"""Block Jacobians ``J^l_{t1 t2} = d f^l(X^{l-1})_{t2} / d x^{l-1}_{t1}`` by batched VJPs and JVPs.

One batch of d vector-Jacobian products of output token t2 gives ``J_{t1 t2}`` for every input
token t1 <= t2 at once. For causal models the block is re-invoked on the prefix of tokens <= t2
only (re-recorded from a forward pass of that prefix), so nothing is computed for t1 > t2. One
batch of d Jacobian-vector products of input token t1 gives ``J_{t1 t2}`` for every output token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from blockcoupling.jacobians.adapters import adapter_for
from blockcoupling.jacobians.capture import (
    BlockCall,
    accepts_use_cache,
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


def _guard_tolerance(block: nn.Module) -> float:
    """Relative tolerance of the single-token path's forward-value check against the full
    sequence re-invoked in the same compute dtype: 1e-8 in float64, 1e-3 in float32, and twice
    the storage precision for half-precision models (whose prefix KV cache was computed and
    stored in half precision: measured 2e-3 for bfloat16, 2e-4 for float16).
    """
    dtype = compute_dtype(block)
    if dtype == torch.float64:
        return 1e-8
    storage = [p.dtype for p in block.parameters() if p.is_floating_point()]
    return max([1e-3] + [2 * torch.finfo(d).eps for d in storage])


def _agrees(value: torch.Tensor, expected: torch.Tensor, tolerance: float) -> bool:
    """Whether ``value`` equals ``expected`` to ``tolerance`` relative (2-norm)."""
    return bool((value - expected).norm() <= tolerance * max(float(expected.norm()), 1e-12))


class JacobianEngine:
    """Jacobians of one prompt's blocks. ``inputs``: the model inputs of the prompt, batch 1,
    e.g. ``{'input_ids': (1, token)}``. Recorded calls of each prefix are cached. ``label``
    (e.g. ``"model gpt2, prompt p0003"``) names the prompt in errors.
    """

    def __init__(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        chunk_size: int | None = None,
        label: str = "",
    ):
        self.model = model
        self.label = label
        self.inputs = inputs
        self.chunk_size = chunk_size
        self.causal = adapter_for(model).causal
        self._calls: dict[int, list[BlockCall]] = {}
        self._token_calls: dict[int, list[BlockCall] | None] = {}
        self.full = record_calls(model, **inputs)
        self.n_tokens = int(self.full[0].input.shape[0])  # tokens as the blocks see them
        self._calls[self.n_tokens] = self.full
        self.fallbacks = 0  # diagonal Jacobians that had to take the full-sequence path
        self.composed = 0  # diagonal Jacobians composed from the weights (token_jacobian)
        self.not_composed = 0  # diagonal Jacobians by autograd (no or a refused composition)
        self.loop_fallbacks = 0  # VJP/JVP batches torch.func refused: plain autograd loops
        self.refusals: Counter[str] = Counter()  # why a single-token path was not taken
        self._compute_block: tuple[nn.Module | None, nn.Module | None] = (None, None)

    def _refuse(self, path: str, error: Exception) -> None:
        """Count why ``path`` was refused: the error's type and first line."""
        line = (str(error).splitlines() or [""])[0][:200]
        self.refusals[f"{path}: {type(error).__name__}: {line}"] += 1

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
        token t alone with a snapshot of the cache of tokens < t: composed from its weights when
        the adapter table says how (``token_jacobian``, counted in ``composed``), else re-invoked
        under autograd (~t times cheaper than the full sequence; counted in ``not_composed``).
        A forward-value check against the full pass guards both, and any mismatch falls back to
        ``output_token`` (counted in ``fallbacks`` too).
        """
        jac = self._composed(layer, t)
        if jac is not None:
            self.composed += 1
            return _finite(jac[None], layer, f"t2={t}", first=t, label=self.label)[0]
        self.not_composed += 1
        checked = self._token_call(layer, t)
        if checked is None:
            self.fallbacks += 1
            return self.output_token(layer, t)[t]
        residual, x = checked
        chunk = self._chunk(x, attended=t + 1)
        jac = output_token_jacobians(residual, x, 0, chunk, self._count_loop_fallback)
        return _finite(jac, layer, f"t2={t}", first=t, label=self.label)[0]

    def _token_calls_at(self, t: int) -> list[BlockCall] | None:
        """Every block's single-token call at t (recorded once), or None without a KV cache."""
        if not self.causal or "input_ids" not in self.inputs or not accepts_use_cache(self.model):
            return None
        if t not in self._token_calls:
            try:
                self._token_calls[t] = record_token_calls(self.model, self.inputs["input_ids"], t)
            except (RuntimeError, ValueError, TypeError, AttributeError) as error:
                self._refuse("recording the token calls", error)
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

    def _composed(self, layer: int, t: int) -> torch.Tensor | None:
        """``J_tt`` composed from the block's weights (``token_jacobian``), if the adapter table
        has a composition for the architecture and its value passes the guard.
        """
        spec = adapter_for(self.model).token_jacobian
        calls = self._token_calls_at(t) if spec is not None else None
        if calls is None:
            return None
        call = calls[layer - 1]
        try:
            with torch.no_grad():
                jac, value = token_jacobian(call, self._block(call.block), spec)
                expected = self._expected(layer, t, value.dtype)
        except (NotComposable, RuntimeError, ValueError, TypeError, AttributeError) as error:
            self._refuse("composition", error)
            return None
        if not _agrees(value, expected, _guard_tolerance(call.block)):
            self.refusals["composition: its value differs from the full pass"] += 1
            return None
        if not (torch.isfinite(value.square().sum()) and torch.isfinite(jac).all()):
            # overflowing values (huge weights): the composition and autograd overflow in other
            # places, so the reference path decides, and names the layer as non-finite
            self.refusals["composition: a non-finite value or Jacobian"] += 1
            return None
        return jac

    def _token_call(
        self, layer: int, t: int
    ) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor] | None:
        """The single-token residual function and its input ``(1, d)``, if it passes the guard."""
        calls = self._token_calls_at(t)
        if calls is None:
            return None
        call = calls[layer - 1]
        dtype = compute_dtype(call.block)
        residual, x = self._residual(call), call.input.to(dtype)
        try:
            with torch.no_grad():
                value = residual(x)[0]
                expected = self._expected(layer, t, dtype)
        except (RuntimeError, ValueError, TypeError) as error:
            self._refuse("single-token call", error)
            return None
        if not _agrees(value, expected, _guard_tolerance(call.block)):
            self.refusals["single-token call: its value differs from the full pass"] += 1
            return None
        return residual, x

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
