"""The calibrated measures against independent computations: the spectrum-matched null of m_K
against a brute-force Monte Carlo with ``scipy.stats.ortho_group`` bases and explicit SVDs
(``coupling.mis_coupling``), the subspace overlap against its definition and its K/d chance
level, and the registry against docs/datasets.md."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import REPO
from scipy.stats import ortho_group
from tiny_models import ARCHITECTURES, CharTokenizer

from blockcoupling.coupling import registry as measures
from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset, token_coupling_dataset
from blockcoupling.coupling.null import spectrum_null
from blockcoupling.jacobians import statistics as coupling
from blockcoupling.jacobians.extract import ExtractConfig, extract
from blockcoupling.stats.selection import Bootstrap, Selection

SPECTRA = {
    "flat": lambda d: np.ones(d),
    "power law": lambda d: np.arange(1, d + 1, dtype=float) ** -1.0,
    "rank deficient": lambda d: np.r_[np.linspace(3.0, 1.0, d // 4), np.zeros(d - d // 4)],
}


def in_random_bases(s: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """``U diag(s) V^T`` with Haar-random U, V (float64)."""
    d = len(s)
    u = ortho_group.rvs(d, random_state=rng)
    v = ortho_group.rvs(d, random_state=rng)
    return torch.from_numpy(u @ np.diag(s) @ v.T)


def brute_null(s: np.ndarray, k: int, draws: int, seed: int) -> tuple[float, float]:
    """Mean and standard error of m_K(J_i, J_j) for J_i with spectrum s in Haar-random bases and
    an unrelated J_j (its bases Haar-random too): explicit matrices, explicit SVDs.
    """
    rng = np.random.default_rng(seed)
    reference = np.linspace(2.0, 1.0, len(s))  # J_j's spectrum does not matter, its bases do
    values = [
        coupling.mis_coupling(in_random_bases(s, rng), in_random_bases(reference, rng), k)
        for _ in range(draws)
    ]
    return float(np.mean(values)), float(np.std(values, ddof=1) / np.sqrt(draws))


@pytest.mark.parametrize("name", list(SPECTRA))
@pytest.mark.parametrize(("d", "k"), [(8, 2), (16, 4)])
def test_the_null_equals_a_brute_force_monte_carlo(name: str, d: int, k: int) -> None:
    s = np.sort(SPECTRA[name](d))[::-1]
    mean, se = spectrum_null(
        s[None], np.array([np.sum(s**2)]), d, (k,), ("authors",), ("p",), draws=2000, seed=1
    )
    brute, brute_se = brute_null(s, k, 300, seed=2)
    assert abs(mean[0, 0, 0, 0] - brute) < 4 * np.hypot(se[0, 0, 0, 0], brute_se) + 1e-9


def test_the_flat_tail_beyond_k_max_matches_the_full_spectrum() -> None:
    """Only the top K_max values and the tail's sum of squares are stored: a power-law tail
    replaced by a flat one with the same sum of squares gives the same null (within its error)."""
    d, k_max = 32, 8
    s = np.arange(1, d + 1, dtype=float) ** -0.7
    top = s[None, :k_max]
    full = spectrum_null(
        s[None],
        np.array([np.sum(s**2)]),
        d,
        (4, 8),
        ("authors", "offdiag"),
        ("p", "trace"),
        draws=4000,
        seed=3,
    )
    tail = spectrum_null(
        top,
        np.array([np.sum(s**2)]),
        d,
        (4, 8),
        ("authors", "offdiag"),
        ("p", "trace"),
        draws=4000,
        seed=4,
    )
    gap = np.abs(full[0] - tail[0])
    assert np.all(gap < 4 * np.hypot(full[1], tail[1]) + 1e-3), gap


def test_excess_is_zero_in_random_bases_and_positive_for_shared_bases() -> None:
    rng = np.random.default_rng(5)
    d, k = 24, 4
    s_i = np.linspace(3.0, 0.5, d)
    null, se = spectrum_null(
        s_i[None], np.array([np.sum(s_i**2)]), d, (k,), ("authors",), ("p",), draws=2000, seed=6
    )
    unrelated, unrelated_se = brute_null(s_i, k, 300, seed=7)
    excess, excess_se = null[0, 0, 0, 0] - unrelated, np.hypot(se[0, 0, 0, 0], unrelated_se)
    assert abs(excess) < 4 * excess_se  # unrelated bases: no more coupled than chance
    u, v = ortho_group.rvs(d, random_state=rng), ortho_group.rvs(d, random_state=rng)
    j_i = torch.from_numpy(u @ np.diag(s_i) @ v.T)
    j_j = torch.from_numpy(u @ np.diag(np.linspace(5.0, 0.1, d)) @ v.T)  # same singular vectors
    shared = null[0, 0, 0, 0] - coupling.mis_coupling(j_i, j_j, k)
    assert shared > 0.5 * null[0, 0, 0, 0] and shared > 20 * excess_se


def test_overlap_of_random_subspaces_is_k_over_d_and_one_for_the_same_subspace() -> None:
    rng = np.random.default_rng(8)
    d, k_max, draws = 20, 6, 400
    values = np.empty((draws, k_max))
    for i in range(draws):
        a, b = (
            ortho_group.rvs(d, random_state=rng)[:, :k_max],
            ortho_group.rvs(d, random_state=rng)[:, :k_max],
        )
        product = a.T @ b
        corner = np.cumsum(np.cumsum(product**2, axis=0), axis=1).diagonal()
        import xarray as xr

        values[i] = measures._overlap(
            xr.DataArray(corner, dims="k", coords={"k": np.arange(1, k_max + 1)}),
            list(range(1, k_max + 1)),
        ).values
        direct = [np.sum((a[:, :kk].T @ b[:, :kk]) ** 2) / kk for kk in range(1, k_max + 1)]
        np.testing.assert_allclose(values[i], direct, rtol=1e-12)
    expected = (
        measures.measure("overlap_u")
        .chance(  # the registry's chance level: K/d
            measures.PairStats(None, None, None, None, list(range(1, k_max + 1)), d)
        )
        .values
    )
    np.testing.assert_allclose(expected, np.arange(1, k_max + 1) / d)
    se = values.std(axis=0, ddof=1) / np.sqrt(draws)
    assert np.all(np.abs(values.mean(axis=0) - expected) < 4 * se)


@pytest.fixture(scope="module")
def tiny():
    config = ExtractConfig(k_max=6, token_layers=(-1,), token_prompts=1)
    result = extract(
        ARCHITECTURES["llama"](), CharTokenizer(), ["hello", "abcd"], config, progress=False
    )
    metric = MetricConfig(ks=(2, 6), null_draws=64)
    return (
        result,
        coupling_dataset(result["depth"], metric),
        token_coupling_dataset(result["tokens"], metric),
    )


def test_the_depth_measures_of_a_real_model_fit_together(tiny) -> None:
    result, ds, _ = tiny
    d = result["depth"].attrs["hidden_size"]
    same = ds["depth_overlap_u"].sel(layer=1, layer_ref=1)
    np.testing.assert_allclose(same.values, 1.0, rtol=1e-10)  # a subspace with itself
    sel = dict(reading="authors", norm="p", k=2, variant="ujv")
    np.testing.assert_allclose(  # the excess is the distance from chance of raw coupling
        ds["coupling_excess"].sel(**sel).values,
        (ds["coupling"] - ds["coupling_null"]).sel(**sel).values,
        rtol=1e-10,
    )
    np.testing.assert_allclose(ds["overlap_null"].values, [2 / d, 6 / d])
    s2, s4 = result["spectra"]["singular_values"] ** 2, result["spectra"]["singular_values"] ** 4
    np.testing.assert_allclose(  # participation ratio of the full spectrum
        ds["effective_rank"].values, (s2.sum("rank") ** 2 / s4.sum("rank")).values, rtol=1e-6
    )
    assert (ds["depth_null_se"] > 0).all() and (ds["depth_null_se"] < 0.05).all()


def test_the_token_families_carry_every_registered_measure(tiny) -> None:
    _, _, tokens = tiny
    for family in ("self", "fixed_in", "fixed_out"):
        for entry in measures.MEASURES:
            assert f"{family}_{entry.name}" in tokens
    diagonal = tokens["self_overlap_u"].sel(layer=tokens["layer"][0], layer_ref=tokens["layer"][0])
    same = np.diagonal(diagonal.isel(prompt=0).transpose("k", "token", "token_ref").values, 0, 1, 2)
    finite = same[np.isfinite(same)]
    np.testing.assert_allclose(finite, 1.0, rtol=1e-10)


def test_every_registered_measure_is_documented() -> None:
    docs = (REPO / "docs" / "datasets.md").read_text(encoding="utf-8")
    for entry in measures.MEASURES:
        assert f"depth_{entry.name}" in docs and f"{{family}}_{entry.name}" in docs, entry.name
    for name in (
        "depth_null",
        "depth_null_se",
        "effective_rank",
        "coupling_null",
        "coupling_excess",
        "adjacent_excess",
        "overlap_null",
        "sv_sum2",
        "depth_ucorner",
    ):
        assert f"`{name}" in docs, name


def test_the_calibration_table_summarises_the_combined_measures(tiny) -> None:
    from blockcoupling.files.combine import combine
    from blockcoupling.stats.calibration import calibration_markdown, calibration_table

    _, ds, _ = tiny
    meta = {"m": {"d_model": 16, "family": "grid"}, "p": {"d_model": 16, "family": "pretrained"}}
    parts = {(m, step): ds for m in ("m", "p") for step in ("final", "random")}
    combined = combine(parts, "coupling", "init", meta)
    table = calibration_table(combined, (2, 6), Selection())
    assert len(table) == 2 * 2 * 2  # models x inits x K
    row = table[(table["model"] == "m") & (table["k"] == 2)].iloc[0]
    at = dict(reading="authors", norm="p", k=2, variant="ujv")
    assert row["coupling"] == pytest.approx(float(ds["coupling"].sel(**at).mean()))
    assert row["coupling_excess"] == pytest.approx(row["coupling"] - row["coupling_null"])
    assert row["overlap_null"] == pytest.approx(2 / ds.attrs["hidden_size"])
    text = calibration_markdown(table, grids=["grid"])
    assert "| p | random |" in text and "| grid (1 run, mean [range]) | trained |" in text
    meta["m2"] = meta["m"]  # a second run of the grid whose models equal the first's
    parts = {(m, step): ds for m in ("m", "m2", "p") for step in ("final", "random")}
    table = calibration_table(combine(parts, "coupling", "init", meta), (2,), Selection())
    text = calibration_markdown(table, grids=["grid"])
    assert "| grid (2 runs, 1 distinct model, mean [range]) | random |" in text


def test_the_model_table_carries_the_calibrated_measures_with_their_nulls(tiny) -> None:
    from blockcoupling.files.combine import combine
    from blockcoupling.stats import crossmodel

    _, ds, _ = tiny
    meta = {m: {"d_model": 16, "family": "f", "params": 1e6} for m in ("m", "n")}
    combined = combine(
        {(m, s): ds for m in meta for s in ("final", "random")}, "coupling", "init", meta
    )
    at, boot = Selection(k=2), Bootstrap(n_boot=50)
    table = crossmodel.model_table(crossmodel.model_coupling(combined, at, boot))
    table = crossmodel.with_calibrated(table, combined, at, boot)
    excess = float(ds["coupling_excess"].sel(**at).mean())
    assert table["coupling_excess"].tolist() == pytest.approx([excess, excess])
    assert table["coupling_excess_low"].isna().all()  # 2 prompts: no bootstrap below 5 units
    assert table["overlap_null"].tolist() == pytest.approx([2 / 16, 2 / 16])
    assert table["coupling_null"].iloc[0] == pytest.approx(
        float(ds["coupling_null"].sel(reading="authors", norm="p", k=2).mean())
    )
