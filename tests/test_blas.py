"""Pinned matmuls through numpy's OpenBLAS (blockcoupling.runtime.blas): the same products as
an independent elementwise sum, ATen's errors, autograd and torch.func on top."""

import numpy as np
import pytest
import torch
from torch.func import jacfwd, jacrev, vmap

from blockcoupling.runtime import blas


def elementwise(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` as a broadcast product summed over k in float64 (no GEMM)."""
    return (a.double().unsqueeze(-1) * b.double().unsqueeze(-3)).sum(-2)


@pytest.fixture(autouse=True)
def routed() -> None:
    """The test session routes as every pinned job does (conftest); route here otherwise."""
    blas.route_matmuls()


def test_routed_products_are_numpys_bits() -> None:
    a, b = torch.randn(33, 17), torch.randn(17, 9)
    assert np.array_equal((a @ b).numpy(), np.matmul(a.numpy(), b.numpy()))  # numpy's bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mm_bmm_addmm_match_an_elementwise_sum(dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = (
        torch.randn(7, 5, generator=gen, dtype=dtype),
        torch.randn(5, 3, generator=gen, dtype=dtype),
    )
    bias = torch.randn(3, generator=gen, dtype=dtype)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(torch.mm(a, b).double(), elementwise(a, b), **tol)
    torch.testing.assert_close(
        torch.mm(a.t().contiguous().t(), b).double(), elementwise(a, b), **tol
    )
    torch.testing.assert_close(
        torch.mm(a, b.t().contiguous().t()).double(), elementwise(a, b), **tol
    )
    torch.testing.assert_close(
        torch.addmm(bias, a, b, beta=0.5, alpha=2.0).double(),
        0.5 * bias.double() + 2.0 * elementwise(a, b),
        **tol,
    )
    nan_bias = torch.full((3,), float("nan"), dtype=dtype)  # beta = 0 ignores it, as ATen does
    assert torch.isfinite(torch.addmm(nan_bias, a, b, beta=0)).all()
    x, y = torch.randn(4, 7, 5, generator=gen, dtype=dtype), torch.randn(4, 5, 3, dtype=dtype)
    torch.testing.assert_close(torch.bmm(x, y).double(), elementwise(x, y), **tol)


def test_aten_errors_and_edge_cases_are_kept() -> None:
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(torch.randn(2, 3), torch.randn(4, 2))
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.mm(torch.randn(2, 3), torch.randn(3, 2, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="3-D"):
        torch.bmm(torch.randn(2, 3), torch.randn(3, 2))
    assert torch.mm(torch.randn(0, 3), torch.randn(3, 2)).shape == (0, 2)
    assert torch.equal(torch.mm(torch.randn(2, 0), torch.randn(0, 2)), torch.zeros(2, 2))
    half = torch.mm(torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(3, 2, dtype=torch.bfloat16))
    assert half.dtype == torch.bfloat16 and torch.equal(half.float(), torch.full((2, 2), 3.0))
    inf = torch.mm(torch.tensor([[float("inf"), 1.0]]), torch.tensor([[1.0], [1.0]]))
    assert torch.isinf(inf).all()


def test_autograd_and_torch_func_run_on_top() -> None:
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, generator=gen, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x, y: torch.addmm(bias, x, y), (a, b))
    assert torch.autograd.gradcheck(lambda x, y: torch.bmm(x[None], y[None]), (a, b))

    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ b.detach()) @ b.detach().t()

    x = a.detach()
    torch.testing.assert_close(jacrev(block)(x), jacfwd(block)(x))  # reverse and forward mode
    batch = torch.randn(6, 5, 3, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(vmap(block)(batch), torch.stack([block(row) for row in batch]))
