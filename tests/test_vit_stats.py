"""The ViT sweep's statistics against hand computations, and its two figures from synthetic data."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats as sps

from blockcoupling import figures
from blockcoupling.stats import core, vit
from blockcoupling.stats.selection import Bootstrap, Selection

SD, WD, SEEDS, IMAGES = [0.0, 0.1, 0.3], [0.0, 0.05], [0, 1, 2], 5
SEL = Selection(k=4)


def make_combined(seed: int = 0) -> xr.Dataset:
    """A `vit_results.grid_dataset`-like dataset: coupling rises with sd, accuracy with coupling."""
    rng = np.random.default_rng(seed)
    shape = (len(SD), len(WD), len(SEEDS))
    model_effect = rng.normal(0, 0.02, shape)
    coupling = (
        -1
        + 0.5 * np.asarray(SD)[:, None, None, None]
        + model_effect[..., None]
        + rng.normal(0, 0.01, (*shape, IMAGES))
    )
    accuracy = 0.8 + 2 * model_effect + rng.normal(0, 0.005, shape)
    coords = {
        "sd": SD,
        "wd": WD,
        "seed": SEEDS,
        "image": [f"test{i:05d}" for i in range(IMAGES)],
        "reading": ["authors"],
        "norm": ["p"],
        "k": [4],
        "variant": ["ujv", "vju"],
    }
    dims = ("sd", "wd", "seed", "reading", "norm", "k", "variant", "image")
    full = np.broadcast_to(
        coupling[:, :, :, None, None, None, None, :], (*shape, 1, 1, 1, 2, IMAGES)
    )
    return xr.Dataset(
        {
            "coupling": (dims, full.copy()),
            "adjacent_coupling": (dims, full.copy() + 0.05),
            "test_accuracy": (("sd", "wd", "seed"), accuracy),
            "test_loss": (("sd", "wd", "seed"), 1 - accuracy),
        },
        coords=coords,
    )


@pytest.fixture(scope="module")
def combined() -> xr.Dataset:
    return make_combined()


@pytest.fixture(scope="module")
def table(combined) -> pd.DataFrame:
    return vit.vit_model_table(combined, SEL, Bootstrap(n_boot=200, seed=0))


def test_crossed_bootstrap_equals_a_naive_loop() -> None:
    values = np.random.default_rng(1).normal(size=(2, 3, 4))
    values[1, 2, 3] = np.nan
    got = vit.crossed_bootstrap_means(values, 50, np.random.default_rng(7))
    rng = np.random.default_rng(7)
    seeds = rng.integers(0, 3, size=(50, 3))
    images = rng.integers(0, 4, size=(50, 4))
    naive = [np.nanmean(values[:, s][:, :, i]) for s, i in zip(seeds, images)]
    assert np.allclose(got, naive)


def test_model_table_means_and_ci(combined, table) -> None:
    assert len(table) == len(SD) * len(WD) * len(SEEDS)
    row = table[(table.sd == 0.1) & (table.wd == 0.05) & (table.seed == 2)].iloc[0]
    cell = combined["coupling"].sel(sd=0.1, wd=0.05, seed=2, variant="ujv").values.ravel()
    assert row.coupling == pytest.approx(cell.mean())
    assert row.coupling_low < row.coupling < row.coupling_high
    assert row.adjacent_coupling == pytest.approx(cell.mean() + 0.05)
    assert row.test_accuracy == pytest.approx(
        float(combined.test_accuracy.sel(sd=0.1, wd=0.05, seed=2))
    )
    assert row.n_images == IMAGES
    again = vit.vit_model_table(combined, SEL, Bootstrap(n_boot=200, seed=0))
    pd.testing.assert_frame_equal(table, again)  # seeded


def test_coupling_by_rate_by_hand(combined) -> None:
    frame = vit.vit_coupling_by_rate(combined, SEL, Bootstrap(n_boot=300, seed=4))
    assert len(frame) == len(SD) * (1 + len(WD))
    values = vit.vit_coupling_values(combined, SEL)
    for sd in SD:
        pooled = frame[(frame.sd == sd) & (frame.wd == "all")].iloc[0]
        cube = values.sel(sd=sd).values
        assert pooled.coupling == pytest.approx(cube.mean())
        seed_means = cube.mean(axis=(0, 2))  # 3 seeds: too few for a bootstrap, their range
        assert (pooled.ci_low, pooled.ci_high) == pytest.approx(
            (seed_means.min(), seed_means.max())
        )
        one = frame[(frame.sd == sd) & (frame.wd == "0.05")].iloc[0]
        assert one.coupling == pytest.approx(values.sel(sd=sd, wd=0.05).values.mean())
        assert one.n_models == len(SEEDS) and pooled.n_models == len(SEEDS) * len(WD)


def test_sd_trend_ols_and_spearman_by_hand(table) -> None:
    trend = vit.vit_sd_trend(table).set_index(["response", "method"])
    design = np.column_stack([np.ones(len(table)), table.sd, table.wd == 0.05])
    slope = np.linalg.lstsq(design, table.coupling, rcond=None)[0][1]
    row = trend.loc[("coupling", "ols")]
    assert row.estimate == pytest.approx(slope)
    assert row.ci_low < slope < row.ci_high and row.p < 0.05  # the synthetic trend is found
    rho = sps.spearmanr(table.sd, table.test_accuracy).statistic
    assert trend.loc[("test_accuracy", "spearman")].estimate == pytest.approx(rho)


def test_sd_trend_has_no_slope_where_each_rate_has_its_own_decay(table) -> None:
    """A grid with one decay per rate (no crossing): ``y ~ sd + C(wd)`` cannot separate the rate
    from the decay, so no OLS slope (it would be a pseudo-inverse's split), the Spearman stays."""
    rates = sorted(table.sd.unique())
    decays = {sd: float(i) for i, sd in enumerate(rates)}
    confounded = table.assign(wd=table.sd.map(decays))
    trend = vit.vit_sd_trend(confounded).set_index(["response", "method"])
    row = trend.loc[("coupling", "ols")]
    assert np.isnan(row.estimate) and "its own decays" in row.note
    assert np.isfinite(trend.loc[("coupling", "spearman")].estimate)


def _holm(p: list[float]) -> list[float]:
    order = np.argsort(p)
    adjusted, running = np.empty(len(p)), 0.0
    for rank, i in enumerate(order):
        running = max(running, (len(p) - rank) * p[i])
        adjusted[i] = min(1.0, running)
    return list(adjusted)


def test_coupling_accuracy_per_rate_holm_and_pooled_by_hand(table) -> None:
    frame = vit.vit_coupling_accuracy(table)
    pearson = frame[frame.method == "pearson"].reset_index(drop=True)
    hand = [sps.pearsonr(g.coupling, g.test_accuracy) for _, g in table.groupby("sd")]
    assert list(pearson.estimate) == pytest.approx([h.statistic for h in hand])
    assert list(pearson.p_holm) == pytest.approx(_holm([h.pvalue for h in hand]))
    assert pearson.note.str.contains("Holm-adjusted over the 3").all()
    pooled = frame[frame.sd == "pooled"].set_index("method")
    dummies = pd.get_dummies(table.sd, drop_first=True).to_numpy(dtype=float)
    design = np.column_stack([np.ones(len(table)), table.coupling, dummies])
    slope = np.linalg.lstsq(design, table.test_accuracy, rcond=None)[0][1]
    assert pooled.loc["within_ols"].estimate == pytest.approx(slope)
    centred = table.groupby("sd")[["coupling", "test_accuracy"]].transform(lambda c: c - c.mean())
    r = np.corrcoef(centred.coupling, centred.test_accuracy)[0, 1]
    assert pooled.loc["within_r"].estimate == pytest.approx(r)
    assert pooled.loc["within_r"].estimate > 0.5  # accuracy follows coupling in the synthetic data
    assert "not fitted: seeds recur across rates" in pooled.loc["mixedlm"].note


def test_pooled_within_rate_takes_the_seed_as_its_unit() -> None:
    """A seed fixes a ViT's init and data order at every rate: the pooled within-rate slope's
    interval counted ViTs (classical OLS, Fisher z over n ViTs) where seeds recur across
    rates. Its interval is now CR1 by seed, t(S-1) (statsmodels by hand), none from 3 seeds."""
    import statsmodels.formula.api as smf

    rng = np.random.default_rng(4)
    rows = []
    for seed in range(6):
        shared = rng.normal()  # the seed's init moves coupling and accuracy at every rate
        for sd in (0.0, 0.1, 0.2, 0.3):
            x = shared + 0.3 * rng.normal()
            rows.append(dict(sd=sd, seed=seed, coupling=x, test_accuracy=0.5 + 0.1 * x))
    frame = pd.DataFrame(rows)
    frame["test_accuracy"] += 0.02 * rng.normal(size=len(frame))
    pooled = vit.vit_coupling_accuracy(frame, methods=("pearson",))
    pooled = pooled[pooled.sd == "pooled"].set_index("method")
    fit = smf.ols("test_accuracy ~ coupling + C(sd)", data=frame).fit(
        cov_type="cluster", cov_kwds={"groups": frame["seed"]}, use_t=True
    )
    low, high = fit.conf_int().loc["coupling"]
    row = pooled.loc["within_ols"]
    assert row.estimate == pytest.approx(fit.params["coupling"])
    assert (row.ci_low, row.ci_high) == (pytest.approx(low), pytest.approx(high))
    assert row.p == pytest.approx(fit.pvalues["coupling"]) and row.n == 6
    assert "CR1 by seed, t(5)" in row.note and "wild cluster bootstrap p" in row.note
    assert np.isnan(pooled.loc["within_r"].ci_low) and pooled.loc["within_r"].n == 6
    few = vit.vit_coupling_accuracy(frame[frame.seed < 3], methods=("pearson",))
    few = few[few.sd == "pooled"].set_index("method").loc["within_ols"]
    assert np.isnan(few.ci_low) and np.isnan(few.p) and "3 clusters < 5" in few.note


def test_too_few_models_give_nan_with_a_reason(table) -> None:
    small = table[table.seed == 0].groupby("sd").head(1)
    frame = vit.vit_coupling_accuracy(small)
    assert frame.estimate.isna().all()
    assert frame[frame.method == "pearson"].note.str.contains("n=1 < 4").all()
    assert frame[frame.sd == "pooled"].note.str.contains("too few").all()


def test_vit_figures_render(tmp_path: Path, combined, table) -> None:
    by_rate = vit.vit_coupling_by_rate(combined, SEL, Bootstrap(n_boot=100, seed=0))
    for name, frame in (("vit_coupling_vs_sd", by_rate), ("vit_coupling_vs_accuracy", table)):
        csv = tmp_path / f"{name}.csv"
        core.write_table(frame, csv)
        png, pdf = figures.render(name, csv, tmp_path / f"{name}.png")
        assert pdf.is_file() and pdf.stat().st_size > 1000
        image = mpimg.imread(png)
        assert image.shape[0] > 300 and image.shape[1] > 300
    figures.vit_coupling_vs_accuracy(table.iloc[:0], tmp_path / "empty")  # no data: a marked panel


def test_calibrated_measures_and_nulls_reach_every_sweep_table() -> None:
    """With ``coupling_excess``, ``overlap_u`` and the nulls in the dataset, every ViT table
    carries them beside raw coupling, each computed as the raw one is (checked by hand).
    """
    base = make_combined(3)
    rng = np.random.default_rng(4)
    excess = base["coupling"] * 0 + rng.normal(0.1, 0.02, base["coupling"].shape)
    calibrated = base.assign(
        coupling_excess=excess,
        coupling_null=base["coupling"] + excess,
        overlap_u=excess * 2 + 0.3,
        overlap_null=xr.full_like(base["test_accuracy"], 0.25).expand_dims(k=[4], axis=-1),
    )  # as vit_results writes it: K/d per model, no image or variant dims
    models = vit.vit_model_table(calibrated, SEL, Bootstrap(n_boot=200, seed=0))
    plain = vit.vit_model_table(base, SEL, Bootstrap(n_boot=200, seed=0))
    assert np.allclose(models.coupling, plain.coupling)  # raw coupling unchanged
    cell = dict(sd=0.1, wd=0.05, seed=2)
    row = models[(models.sd == 0.1) & (models.wd == 0.05) & (models.seed == 2)].iloc[0]
    at = excess.sel(reading="authors", norm="p", k=4, variant="ujv", **cell).values
    assert row.coupling_excess == pytest.approx(at.mean())
    assert row.coupling_excess_low <= row.coupling_excess <= row.coupling_excess_high
    assert row.overlap_null == pytest.approx(0.25) and row.overlap_u == pytest.approx(
        2 * at.mean() + 0.3
    )
    by_rate = vit.vit_coupling_by_rate(calibrated, SEL, Bootstrap(n_boot=100, seed=0))
    pooled = by_rate[(by_rate.sd == 0.3) & (by_rate.wd == "all")].iloc[0]
    values = excess.sel(reading="authors", norm="p", k=4, variant="ujv", sd=0.3).values
    assert pooled.coupling_excess == pytest.approx(values.mean())
    assert {"overlap_u_low", "overlap_u_high", "coupling_null", "ci_low"} <= set(by_rate)
    trend = vit.vit_sd_trend(models)
    assert set(trend.response) == {"coupling", "coupling_excess", "overlap_u", "test_accuracy"}
    ols = trend[(trend.response == "coupling_excess") & (trend.method == "ols")].iloc[0]
    design = np.column_stack(
        [np.ones(len(models)), models.sd, pd.get_dummies(models.wd, drop_first=True)]
    ).astype(float)
    slope = np.linalg.lstsq(design, models.coupling_excess, rcond=None)[0][1]
    assert ols.estimate == pytest.approx(slope)
    accuracy = vit.vit_coupling_accuracy(models)
    assert set(accuracy.measure) == {"coupling", "coupling_excess", "overlap_u"}
    within = accuracy[(accuracy.measure == "overlap_u") & (accuracy.method == "within_ols")]
    dummies = pd.get_dummies(models.sd, drop_first=True).to_numpy(dtype=float)
    design = np.column_stack([np.ones(len(models)), models.overlap_u, dummies])
    slope = np.linalg.lstsq(design, models.test_accuracy, rcond=None)[0][1]
    assert within.estimate.iloc[0] == pytest.approx(slope)
    assert "overlap_u" in within.note.iloc[0]
