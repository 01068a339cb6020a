"""Block Jacobians by central differences, perturbing a block's input inside a full model forward
(the reference for every Jacobian path: independent of the engine's re-invocation of a block)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def block_jacobian(
    block: torch.nn.Module,
    forward: Callable[[dict[str, torch.Tensor]], object],
    inputs: dict[str, torch.Tensor],
    t1: int,
    t2: int,
    eps: float = 1e-5,
) -> torch.Tensor:
    """(d, d) central differences of ``block(x)_t2 - x_t2`` w.r.t. ``x_t1``: ``forward`` runs the
    whole model once on a batch of 2d copies of the batch-1 ``inputs``, a hook moving copy j's
    coordinate j of ``x_t1`` by +eps and copy d + j's by -eps."""

    def residuals(deltas: torch.Tensor) -> torch.Tensor:
        """(batch, d) moves of x_t1 -> (batch, d) of block(x)_t2 - x_t2, one copy each."""
        seen: dict[str, torch.Tensor] = {}

        def pre(module, args, kwargs):  # noqa: ANN001
            hidden = (args[0] if args else kwargs["hidden_states"]).clone()
            hidden[:, t1] += deltas.to(hidden)
            seen["in"] = hidden
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}

        def post(module, args, kwargs, output):  # noqa: ANN001
            seen["out"] = output if isinstance(output, torch.Tensor) else output[0]

        handles = [
            block.register_forward_pre_hook(pre, with_kwargs=True),
            block.register_forward_hook(post, with_kwargs=True),
        ]
        batch = {
            name: value.expand(len(deltas), *value.shape[1:]) for name, value in inputs.items()
        }
        try:
            with torch.no_grad():
                forward(batch)
        finally:
            for handle in handles:
                handle.remove()
        return (seen["out"] - seen["in"])[:, t2]

    d = residuals(torch.zeros(1, 1)).shape[-1]
    moved = residuals(torch.cat([torch.eye(d), -torch.eye(d)]) * eps)
    return ((moved[:d] - moved[d:]) / (2 * eps)).T
