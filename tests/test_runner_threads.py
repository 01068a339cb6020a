"""A job computes on its configured threads, whatever cores Snakemake grants it."""

from __future__ import annotations

import pytest


def test_a_job_computes_on_its_configured_threads_whatever_cores_it_is_granted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Snakemake lowers a job's threads to --cores on a smaller machine; the numbers of training
    and extraction depend on the thread count, so those jobs keep their configured count."""
    from types import SimpleNamespace

    from blockcoupling.runtime.runner import math_threads

    job = SimpleNamespace(rule="train_x", threads=1, params=SimpleNamespace(math_threads=4))
    with caplog.at_level("INFO"):
        assert math_threads(job) == 4
    assert "computing on 4 threads" in caplog.text and "1 core(s) granted" in caplog.text
    assert math_threads(SimpleNamespace(rule="stats", threads=2, params=SimpleNamespace())) == 2
