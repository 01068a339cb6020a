"""Shared test settings."""

import pytest

from blockcoupling.runtime import isa

isa.pin()  # the jobs' code path (AVX2) before torch loads: tests run what the jobs run

import torch  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models and small SVDs run fastest, and steadiest on a shared 2-core machine, on one
    thread (a 64 x 64 SVD took 0.36 s with 2 busy OpenMP threads, 0.6 ms with one)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
