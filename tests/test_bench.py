"""The depth benchmark (bench/depth_speed.py) kept from rotting: its three methods agree."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import load_bench

from blockcoupling.jacobians import spectral
from blockcoupling.jacobians.engine import JacobianEngine


@pytest.fixture(scope="module")
def bench():
    yield load_bench("depth_speed")
    del sys.modules["depth_speed"]


def test_authors_jacobians_equal_the_library_diagonal(bench) -> None:
    model, ids = bench.tiny_llama()
    jacs = bench.authors_jacobians(model, ids, rows=24, phases=bench.Phases())  # 3 row batches
    engine = JacobianEngine(model, {"input_ids": ids})
    expected = torch.stack([engine.diagonal(layer, 5) for layer in (1, 2)])
    assert jacs.shape == (2, 64, 64)
    assert torch.allclose(jacs, expected, atol=1e-5, rtol=1e-4)
    assert engine.fallbacks == 0


def test_three_methods_agree_on_a_tiny_llama(bench, monkeypatch) -> None:
    model, ids = bench.tiny_llama()
    results, phases = {}, {}
    for method in bench.METHODS:
        phases[method] = bench.Phases()
        results[method] = bench.run_method(
            method, model, ids, bench.TINY_KS, None, phases[method], topk=bench.TINY_TOPK
        )
    reference = results["authors"]
    assert reference.shape == (2, 2, 2, 2, 2)  # variant, reading, k, layer, layer_ref
    assert np.allclose(reference[0, ..., [0, 1], [0, 1]], 0.0, atol=1e-5)  # ujv: m_K(J, J) = 0
    assert (reference[:, 0, ..., [0, 1], [1, 0]] > 0.05).all()  # two random blocks (authors)
    for method in ("dense", "topk", "auto"):
        errors = bench.max_errors(results[method], reference, bench.TINY_KS)
        assert errors["max"] < 1e-3, (method, errors)
        assert set(phases[method].seconds) >= {"forward", "jacobians", "svd", "stats", "metric"}
    dense_calls = []
    original = spectral.svd
    monkeypatch.setattr(spectral, "svd", lambda jac: dense_calls.append(jac) or original(jac))
    bench.run_method("topk", model, ids, bench.TINY_KS, topk=bench.TINY_TOPK)
    assert dense_calls == []  # (c) took the randomized path, no dense fallback
    gram_calls = []
    original_gram = bench.measure_module.gram_top_k
    monkeypatch.setattr(
        bench.measure_module,
        "gram_top_k",
        lambda jac, k: gram_calls.append(jac.shape) or original_gram(jac, k),
    )
    bench.run_method("auto", model, ids, bench.TINY_KS)
    assert gram_calls == [(2, 64, 64)]  # (d), the default, took the Gram path


def test_library_timers_are_restored(bench) -> None:
    before = (JacobianEngine.diagonal, bench.measure_module.top_k)
    with bench.library_timers(bench.Phases()):
        assert JacobianEngine.diagonal is not before[0]
    assert (JacobianEngine.diagonal, bench.measure_module.top_k) == before


def test_cases_parse_with_clear_errors(bench) -> None:
    assert bench.parse_case("smollm2:26", 3, 2) == bench.Case("smollm2", 26, 3, 2)
    assert bench.parse_case("llama-4096x2:16:1", 3, 2) == bench.Case("llama-4096x2", 16, 1, 1)
    assert bench.parse_case("llama-64x2:6:3:1", 5, 5) == bench.Case("llama-64x2", 6, 3, 1)
    assert bench.parse_case("llama-64x2:6:2:0", 5, 5) == bench.Case("llama-64x2", 6, 2, 0)
    for bad in ("smollm2", "llama-4096:16", "gpt2:10", "smollm2:1", "smollm2:8:0"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected"):
            bench.parse_case(bad, 3, 3)


def test_authors_rows_are_capped_by_memory(bench) -> None:
    model = bench.random_llama(256, 1, vocab=64)  # intermediate 688
    assert bench.authors_rows_for(model, 10, None, 1.0) == 256
    assert bench.authors_rows_for(model, 10, None, 100 * 10 * 688 * 4 / 2**30) == 100
    assert bench.authors_rows_for(model, 10, 32, 1.0) == 32


@pytest.mark.slow
def test_benchmark_runs_end_to_end(bench, tmp_path, capsys) -> None:
    path = tmp_path / "rows.csv"
    bench.main(["--cases", "llama-128x2:5:1", "--csv", str(path)])
    text = capsys.readouterr().out
    assert "| llama-128x2 | 2 | 128 | 5 |" in text
    rows = path.read_text().splitlines()
    assert len(rows) == 2 and "error_c_max" in rows[0]


def test_phases_sync_report_and_keep_nested_phases_apart(bench) -> None:
    events = []
    phases = bench.Phases(sync=lambda: events.append("sync"), report=lambda n, s: events.append(n))
    with phases.time("jacobians"), phases.time("upcast", nested=True):
        pass
    assert set(phases.seconds) == {"jacobians"} and set(phases.nested) == {"upcast"}
    assert events == ["sync", "sync", "sync", "upcast", "sync", "jacobians"]


def test_the_trained_like_model_has_decaying_block_spectra(bench) -> None:
    """At alpha 0.5 the block Jacobians' spectra decay faster than a flat profile's (alpha 0)
    and far faster than a random init's; built in the dtype asked for."""
    trained_like = load_bench("trained_like")
    shape = {"d": 128, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 344, "vocab": 128}
    ids = torch.arange(10)[None]
    decay = {}
    for alpha in (0.0, 0.5):
        model = trained_like.trained_like_llama(**shape, alpha=alpha, dtype=torch.bfloat16)
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        s = torch.linalg.svdvals(trained_like.depth_jacobians(model, ids).double())
        decay[alpha] = float((s[:, 20] / s[:, 0]).median())
    assert decay[0.5] < 0.5 * decay[0.0]


@pytest.mark.slow
def test_gpu_acceptance_dry_run_measures_every_step(bench, tmp_path) -> None:
    """The GPU acceptance script's steps at a tiny shape on the CPU: each ends without error,
    the rates file it writes is one the planner reads, and the two-block model's Jacobians
    equal a float32 twin's autograd inside a full forward."""
    acceptance = load_bench("gpu_acceptance")
    results = acceptance.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "300"])
    errors = {k: v for k, v in results.items() if isinstance(v, dict) and "error" in v}
    assert not errors
    assert results["fd"]["returncode"] == 0 and "collected" in results["fd"]["summary"]
    assert results["paths"]["methods"] == {"composed": 2}  # every block, no refusal
    assert all(row["refusals"] == [] for row in results["paths"]["blocks"].values())
    assert any("diagonal" in line or "aten::" in line
               for line in results["paths"]["profile of one diagonal call"])  # fmt: skip
    assert results["depth-wise"]["paths"] == {
        "composed": 2, "autograd": 0, "full sequence": 0,
        "choice": "the composition wherever it passes", "refusals": [],
    }  # fmt: skip
    assert results["full spectra"]["seconds"] > 0
    assert all(results["loads"][kind]["passed"] for kind in ("bfloat16", "device_map auto"))
    assert results["full_loads"]["device_map auto"]["largest |m_K - built model's|"] == 0
    assert cost_rates_read(tmp_path / "gpu_rates.json")


def cost_rates_read(path: Path) -> bool:
    from blockcoupling.pipeline import cost

    return cost.load_rates(path).matmul > 0


def test_phase_flops_count_the_products_torch_counts(bench) -> None:
    """The floor table's FLOPs against torch's own count of the matrix products (FlopCounterMode)
    on the tiny Llama: the forward (the recording: every block's linear layers, the head on the
    last token, the attention's 4 L n^2 d left out), the Jacobians' forwards (the KV-cache prefix
    and the token call as ``record_token_calls`` runs them, the guard's re-invocation of each
    block's token call; their attention left out) and the pair statistics (the basis corners'
    symmetric products at half their GEMM count, as numpy's syrk runs them where the matmuls are
    routed).
    """
    from torch.utils.flop_counter import FlopCounterMode

    from blockcoupling.jacobians.capture import (
        record_calls,
        record_token_calls,
        residual_function,
    )
    from blockcoupling.jacobians.spectral import svd
    from blockcoupling.jacobians.statistics import basis_corners, pair_stats

    model, ids = bench.tiny_llama()
    flops = bench.phase_flops(model, ids.shape[1], 4)
    n, d, layers = ids.shape[1], model.config.hidden_size, model.config.num_hidden_layers
    with FlopCounterMode(display=False) as counter:
        full = record_calls(model, input_ids=ids)
    assert flops["forward"] == pytest.approx(counter.get_total_flops() - 4 * layers * n**2 * d)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        for call, reference in zip(record_token_calls(model, ids, n - 1), full, strict=True):
            residual_function(call)(reference.input[n - 1 :])
    attention = 4 * layers * (n - 1) ** 2 * d + 2 * 4 * layers * n * d  # prefix; call and guard
    composition = 2 * layers * d * d * (d + model.config.intermediate_size + d)
    assert flops["jacobians"] - composition == pytest.approx(counter.get_total_flops() - attention)
    jacs = torch.randn(layers, d, d)
    top = svd(jacs).top(4)
    with FlopCounterMode(display=False) as counter:
        pair_stats(jacs, top, ("ujv", "vju"))
    with FlopCounterMode(display=False) as corners:
        basis_corners(top.u)
        basis_corners(top.v)
    total = counter.get_total_flops() + corners.get_total_flops() / 2
    assert flops["stats"] == pytest.approx(total)


def test_shape_floors_run_the_products_the_phases_count(bench, monkeypatch) -> None:
    """The shape-matched floors run, per phase, the products ``phase_flops`` counts at the
    phase's shapes (torch's FlopCounterMode over each floor's kernels on the tiny Llama: the
    forward, the Jacobians' three GEMMs per block and the pair statistics' torch products; the
    basis corners run in numpy's ``syrk``, counted apart), and every floor is positive.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counted: list[int] = []

    def once(work, repeats=3):
        with FlopCounterMode(display=False) as counter:
            work()
        counted.append(counter.get_total_flops())
        return 1.0

    model, ids = bench.tiny_llama()
    k_max, layers, d = 4, model.config.num_hidden_layers, model.config.hidden_size
    flops = bench.phase_flops(model, ids.shape[1], k_max)
    monkeypatch.setattr(bench, "_cpu_seconds", once)
    floors = bench.shape_floors(model, ids.shape[1], k_max)
    assert set(floors) == set(bench.FLOOR_DTYPES)
    forward, jacobians, jacobian_forwards, _, stats, _ = counted
    assert forward == pytest.approx(flops["forward"])
    assert layers * jacobians + jacobian_forwards == pytest.approx(flops["jacobians"])
    assert stats == pytest.approx(flops["stats"] - 2 * d * (layers * k_max) ** 2)
    monkeypatch.undo()
    assert all(v > 0 for v in bench.shape_floors(model, ids.shape[1], k_max).values())
