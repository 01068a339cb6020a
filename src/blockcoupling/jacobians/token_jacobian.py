"""``J_tt`` of a pre-norm rotary decoder block composed from its weights and activations.

The block on token t alone, with the keys and values of tokens < t as constants (they do not
depend on ``x_t``), is ``f(x) = attn(x) + mlp(x + attn(x))`` (Gemma 2/3: with their output
norms). Its Jacobian is composed in forward mode as matrices whose columns are the d input
directions, exploiting structure autograd cannot see: an RMSNorm's Jacobian is diagonal plus
rank one, so ``W N`` costs ``O(m d)`` instead of a GEMM, and the MLP's whole Jacobian is one
product ``M = W_down (a'(g) W_gate N + a(g) W_up N)``. The GEMMs left are ``W_o dO``
(``d x H d_h x d``), ``M`` (``d x I x d``) and ``M dA`` (``d^3``); the q/k/v projections and
the attention over the prefix cost ``O((H d_h + t) d)`` each. Exact (no approximation): the
same function as the re-invoked block, differentiated by hand; tests compare it with finite
differences inside a full forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from blockcoupling.jacobians.adapters import TokenJacobian
from blockcoupling.jacobians.capture import BlockCall, own_layer


class NotComposable(ValueError):
    """A block whose layout the composition does not know (the caller falls back)."""


class _Norm:
    """An RMSNorm at input ``z (..., n)``: ``value = s * z / r``-style output and its Jacobian
    ``N = diag(s) (I - u u^T / n)`` per leading index, ``s = (offset + w) / r``, ``u = z / r``.
    """

    def __init__(self, module: nn.Module, z: torch.Tensor, offset: float):
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        weight = getattr(module, "weight", None)
        if eps is None or weight is None or weight.shape[-1] != z.shape[-1]:
            raise NotComposable(f"{type(module).__name__} is not an RMSNorm with a weight")
        inv_r = torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps)  # as the norm computes it
        self.n = z.shape[-1]
        self.u = z * inv_r
        self.s = (offset + weight.to(z.dtype)) * inv_r
        self.value = module(z)

    def right(self, w: torch.Tensor) -> torch.Tensor:
        """``W N`` for ``W (m, n)`` (a single norm): ``(m, n)``."""
        ws = w * self.s
        return ws - torch.outer(ws @ self.u, self.u) / self.n

    def left(self, a: torch.Tensor) -> torch.Tensor:
        """``N A`` for ``A (..., n, k)`` (one norm per leading index): ``(..., n, k)``."""
        u = self.u[..., :, None]
        return self.s[..., :, None] * (a - u * (u * a).sum(-2, keepdim=True) / self.n)


def _rotate_half(z: torch.Tensor, dim: int) -> torch.Tensor:
    first, second = z.chunk(2, dim=dim)
    return torch.cat((-second, first), dim=dim)


def _rotary(z: torch.Tensor, dz: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
    """Rotary embedding of ``z (heads, d_h)`` and of its Jacobian ``dz (heads, d_h, d)``."""
    rotated = z * cos + _rotate_half(z, -1) * sin
    return rotated, dz * cos[:, None] + _rotate_half(dz, -2) * sin[:, None]


def _linear(module: nn.Module) -> torch.Tensor:
    if type(module) is not nn.Linear:
        raise NotComposable(f"{type(module).__name__} is not an nn.Linear")
    return module.weight


def _prefix(kwargs: dict[str, Any], layer: int | None, like: torch.Tensor) -> Any:
    """The cached keys and values of tokens < t ``(kv_heads, t, d_h)`` each (empty at t = 0)."""
    cache = kwargs.get("past_key_values")
    if cache is None:
        empty = like.new_zeros(like.shape[0], 0, like.shape[-1])
        return empty, empty
    entries = getattr(cache, "layers", None)
    if layer is None or entries is None or layer >= len(entries):
        raise NotComposable("no per-layer KV cache entry for this block")
    keys, values = getattr(entries[layer], "keys", None), getattr(entries[layer], "values", None)
    if keys is None or values is None or keys.numel() == 0:
        empty = like.new_zeros(like.shape[0], 0, like.shape[-1])
        return empty, empty
    return keys[0].to(like.dtype), values[0].to(like.dtype)


def token_jacobian(
    call: BlockCall, block: nn.Module, spec: TokenJacobian
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(J_tt (d, d), f(x)_t (d,))`` of a single-token call (``record_token_calls``; its
    recorded prefix cache as constants), composed from ``block`` (the compute copy: its
    dtype is that of the result). NotComposable when the block is not of the known layout.
    """
    norm = getattr(block, "input_layernorm", None)
    if norm is None or not hasattr(block, "self_attn") or not hasattr(block, "mlp"):
        raise NotComposable(f"{type(block).__name__} has no input_layernorm/self_attn/mlp")
    x = call.input.to(norm.weight.dtype)[0]
    attn_out, d_attn = _attention(block, call.kwargs, x, spec, own_layer(call.block))
    y = x + attn_out
    mlp_norm = block.pre_feedforward_layernorm if spec.sandwich else block.post_attention_layernorm
    mlp_out, m = _mlp(block.mlp, _Norm(mlp_norm, y, spec.norm_offset))
    if spec.sandwich:
        post = _Norm(block.post_feedforward_layernorm, mlp_out, spec.norm_offset)
        mlp_out, m = post.value, post.left(m)
    return torch.addmm(d_attn + m, m, d_attn), attn_out + mlp_out


def _attention(
    block: nn.Module, kwargs: dict[str, Any], x: torch.Tensor, spec: TokenJacobian, layer: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention's output at token t ``(d,)`` and its Jacobian in ``x`` ``(d, d)``.

    Every step after the input norm is linear in the normed input's direction, so the
    Jacobian is taken in the normed input ``a`` (the projections' weights as they are) and
    the norm's ``N`` applied once, on the right of the ``(d, d)`` result.
    """
    attn = block.self_attn
    norm = _Norm(block.input_layernorm, x, spec.norm_offset)
    a, head, d = norm.value, attn.head_dim, x.shape[0]
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    q, k, v = (proj(a).view(-1, head) for proj in projections)  # (heads or kv_heads, d_h)
    dq, dk, dv = (_linear(proj).view(-1, head, d) for proj in projections)  # (.., d_h, d)
    if spec.qk_norm:
        q_norm = _Norm(attn.q_norm, q, spec.norm_offset)
        k_norm = _Norm(attn.k_norm, k, spec.norm_offset)
        q, dq, k, dk = q_norm.value, q_norm.left(dq), k_norm.value, k_norm.left(dk)
    cos, sin = (c.to(x.dtype).reshape(-1, head)[-1] for c in kwargs["position_embeddings"])
    q, dq = _rotary(q, dq, cos, sin)
    k, dk = _rotary(k, dk, cos, sin)
    keys, values = _prefix(kwargs, layer, k)
    group = torch.arange(q.shape[0], device=q.device) // attn.num_key_value_groups
    keys = torch.cat((keys, k[:, None]), dim=1)[group]  # (heads, t + 1, d_h)
    values = torch.cat((values, v[:, None]), dim=1)[group]
    scores = attn.scaling * torch.einsum("hjk,hk->hj", keys, q)
    d_scores = attn.scaling * torch.matmul(keys, dq)  # (heads, t + 1, d)
    d_scores[:, -1] += attn.scaling * torch.einsum("hk,hkd->hd", q, dk[group])
    cap = getattr(attn, "attn_logit_softcapping", None)
    if cap is not None:
        capped = torch.tanh(scores / cap)
        scores, d_scores = cap * capped, d_scores * (1 - capped**2)[..., None]
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        if mask.shape[-1] != scores.shape[-1]:
            raise NotComposable(f"mask of {mask.shape[-1]} keys for {scores.shape[-1]}")
        scores = scores + mask.to(x.dtype).reshape(-1, mask.shape[-1])[-1]
    p = torch.softmax(scores, dim=-1)  # (heads, t + 1)
    d_p = p[..., None] * (d_scores - torch.einsum("hj,hjd->hd", p, d_scores)[:, None])
    out = torch.einsum("hj,hjk->hk", p, values)
    d_out = torch.matmul(values.mT, d_p) + p[:, -1, None, None] * dv[group]  # (heads, d_h, d)
    attn_out = attn.o_proj(out.reshape(-1))
    d_attn = norm.right(_linear(attn.o_proj) @ d_out.reshape(-1, d))
    if spec.sandwich:
        post = _Norm(block.post_attention_layernorm, attn_out, spec.norm_offset)
        attn_out, d_attn = post.value, post.left(d_attn)
    return attn_out, d_attn


def _mlp(mlp: nn.Module, norm: _Norm) -> tuple[torch.Tensor, torch.Tensor]:
    """A gated MLP ``W_down (a(W_gate b) * W_up b)`` at ``b = norm.value``: its output ``(d,)``
    and its Jacobian in the norm's input, ``W_down (a'(g) up W_gate + a(g) W_up) N`` ``(d, d)``
    (one GEMM, the norm's ``N`` applied to its result).
    """
    for name in ("gate_proj", "up_proj", "down_proj", "act_fn"):
        if not hasattr(mlp, name):
            raise NotComposable(f"{type(mlp).__name__} is not a gated MLP (no {name})")
    b = norm.value
    gate, up = mlp.gate_proj(b), mlp.up_proj(b)
    activated, slope = torch.func.jvp(mlp.act_fn, (gate,), (torch.ones_like(gate),))
    inner = torch.addcmul(
        activated[:, None] * _linear(mlp.up_proj), (slope * up)[:, None], _linear(mlp.gate_proj)
    )
    return mlp.down_proj(activated * up), norm.right(_linear(mlp.down_proj) @ inner)
