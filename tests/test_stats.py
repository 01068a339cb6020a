"""Statistics against hand computations (numpy formulas) on small synthetic tables and datasets."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import xarray as xr
from scipy import stats as sps

from blockcoupling.files import io
from blockcoupling.stats import calibration, checkpoints, core, crossmodel
from blockcoupling.stats.selection import Bootstrap, Selection

Z95 = 1.959963984540054  # standard normal 97.5% quantile


def make_table(n: int = 8, slope: float = 2.0, seed: int = 1) -> pd.DataFrame:
    """n models with coupling = slope * score + noise and hyperparameters; every other model is
    base."""
    rng = np.random.default_rng(seed)
    score = rng.normal(50, 10, n)
    return pd.DataFrame(
        {
            "model": [f"m{i}" for i in range(n)],
            "base": np.arange(n) % 2 == 0,
            "score": score,
            "coupling": slope * score + rng.normal(0, 10, n),
            "log10_params": rng.uniform(8, 11, n),
            "n_layers": rng.integers(6, 48, n).astype(float),
            "d_model": rng.integers(256, 4096, n).astype(float),
            "log10_train_tokens": rng.uniform(11, 13, n),
        }
    )


def make_coupling(n_models: int = 4, n_prompts: int = 10, seed: int = 2) -> xr.Dataset:
    """Combined coupling dataset (docs/datasets.md): coupling (model, init, reading, variant, norm,
    k, prompt)."""
    rng = np.random.default_rng(seed)
    shape = (n_models, 2, 2, 2, 2, 3, n_prompts)
    dims = ("model", "init", "reading", "variant", "norm", "k", "prompt")
    sources = ["arc" if i % 2 == 0 else "mmlu" for i in range(n_prompts)]
    return xr.Dataset(
        {"coupling": (dims, -rng.uniform(0.2, 1.0, shape))},
        coords={
            "model": [f"m{i}" for i in range(n_models)],
            "init": ["trained", "random"],
            "reading": ["authors", "offdiag"],
            "variant": ["ujv", "vju"],
            "norm": ["p", "trace"],
            "k": [1, 5, 10],
            "prompt": [f"{s}-{i:04d}" for i, s in enumerate(sources)],
            "prompt_source": ("prompt", sources),
            "params": ("model", 10.0 ** (8 + np.arange(n_models))),
            "n_layers": ("model", 6 + 2 * np.arange(n_models)),
            "d_model": ("model", 128 * (1 + np.arange(n_models))),
            "train_tokens": ("model", [np.nan] + [3e11] * (n_models - 1)),
            "score": ("model", ([40.0, np.nan] + list(50.0 + np.arange(n_models)))[:n_models]),
            "base": ("model", np.arange(n_models) % 2 == 0),
            "family": ("model", ["pythia"] * n_models),
        },
    )


def row(frame: pd.DataFrame, **match) -> pd.Series:
    """The single row of `frame` matching all column=value pairs."""
    mask = np.logical_and.reduce([frame[c] == v for c, v in match.items()])
    assert mask.sum() == 1, match
    return frame[mask].iloc[0]


def fisher(r: float, se: float) -> tuple[float, float]:
    """Hand Fisher-z interval."""
    z = np.arctanh(r)
    return np.tanh(z - Z95 * se), np.tanh(z + Z95 * se)


# --------------------------------------------------------------------------- correlations
def test_pearson_r_p_ci_match_hand_formula():
    table = make_table()
    x, y = table["coupling"].to_numpy(), table["score"].to_numpy()
    n = len(x)
    r = np.sum((x - x.mean()) * (y - y.mean())) / np.sqrt(
        np.sum((x - x.mean()) ** 2) * np.sum((y - y.mean()) ** 2)
    )
    t = r * np.sqrt((n - 2) / (1 - r**2))
    p = 2 * sps.t.sf(abs(t), n - 2)
    out = row(crossmodel.correlations(table), subset="all", predictor="coupling", method="pearson")
    assert out["r"] == pytest.approx(r, abs=1e-12)
    assert out["p"] == pytest.approx(p, rel=1e-6)
    assert (out["ci_low"], out["ci_high"]) == pytest.approx(
        fisher(r, 1 / np.sqrt(n - 3)), abs=1e-10
    )
    assert out["n"] == n and out["reason"] == "" and out["ci_method"] == "fisher_z"
    assert r > 0.5  # the synthetic slope is visible


def test_spearman_is_pearson_of_ranks_with_bonett_wright_ci():
    table = make_table(n=10, seed=3)
    ranks = table[["coupling", "log10_params"]].to_numpy().argsort(axis=0).argsort(axis=0)
    rho = np.corrcoef(ranks[:, 0], ranks[:, 1])[0, 1]
    n = len(table)
    out = row(
        crossmodel.correlations(table, target="log10_params", predictors=("coupling",)),
        subset="all",
        method="spearman",
    )
    assert out["r"] == pytest.approx(rho, abs=1e-12)
    se = np.sqrt((1 + rho**2 / 2) / (n - 3))
    assert (out["ci_low"], out["ci_high"]) == pytest.approx(fisher(rho, se), abs=1e-10)
    assert out["ci_method"] == "fisher_z_bonett_wright"


def test_small_n_gives_nan_and_reason_not_a_number():
    table = make_table(n=3)
    out = crossmodel.correlations(table, predictors=("coupling",), subsets=("all",))
    assert out["r"].isna().all() and out["p"].isna().all() and out["ci_low"].isna().all()
    assert set(out["reason"]) == {"n=3 < 4"}


def test_missing_scores_are_dropped_not_zeroed():
    table = make_table(n=9)
    table.loc[[2, 5], "score"] = np.nan
    kept = table.dropna(subset=["score"])
    out = row(
        crossmodel.correlations(table, predictors=("coupling",)), subset="all", method="pearson"
    )
    assert out["n"] == 7
    assert out["r"] == pytest.approx(np.corrcoef(kept["coupling"], kept["score"])[0, 1], abs=1e-12)
    zeroed = table.fillna({"score": 0.0})
    assert out["r"] != pytest.approx(
        np.corrcoef(zeroed["coupling"], zeroed["score"])[0, 1], abs=1e-3
    )


def test_base_subset_uses_base_rows_only():
    table = make_table(n=10)
    out = crossmodel.correlations(table, predictors=("coupling",), methods=("pearson",))
    base = table[table["base"]]
    got = row(out, subset="base")
    assert got["n"] == int(table["base"].sum()) == 5
    assert got["r"] == pytest.approx(np.corrcoef(base["coupling"], base["score"])[0, 1], abs=1e-12)
    assert row(out, subset="all")["n"] == 10


def test_bad_method_and_column_raise():
    table = make_table()
    with pytest.raises(ValueError, match="method"):
        crossmodel.correlations(table, methods=("kendall",))
    with pytest.raises(ValueError, match="lacks columns"):
        crossmodel.correlations(table, predictors=("nope",))


# --------------------------------------------------------------------------- OLS
def test_ols_r2_and_coefficients_match_lstsq():
    table = make_table(n=12, seed=4)
    preds = ["coupling", "log10_params"]
    out = crossmodel.ols_fits(table, "score", {"both": preds}, subsets=("all",))
    X = table[preds].to_numpy()
    Xz = (X - X.mean(0)) / X.std(0, ddof=1)
    A = np.column_stack([np.ones(len(X)), Xz])
    y = table["score"].to_numpy()
    beta, *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ beta
    r2 = 1 - resid @ resid / np.sum((y - y.mean()) ** 2)
    n, k = len(y), len(preds)
    assert row(out, term="coupling")["coef"] == pytest.approx(beta[1], rel=1e-8)
    assert row(out, term="const")["coef"] == pytest.approx(
        y.mean(), rel=1e-10
    )  # z-scored predictors
    assert out["r2"].iloc[0] == pytest.approx(r2, rel=1e-10)
    assert out["adj_r2"].iloc[0] == pytest.approx(1 - (1 - r2) * (n - 1) / (n - k - 1), rel=1e-10)
    se = np.sqrt(resid @ resid / (n - k - 1) * np.diag(np.linalg.inv(A.T @ A)))
    half = sps.t.ppf(0.975, n - k - 1) * se[1]
    got = row(out, term="coupling")
    assert (got["ci_low"], got["ci_high"]) == pytest.approx(
        (beta[1] - half, beta[1] + half), rel=1e-8
    )


def test_ols_too_few_rows_is_nan_with_reason():
    table = make_table(n=4)
    out = crossmodel.ols_fits(
        table, "score", {"both": ["coupling", "log10_params"]}, subsets=("all",)
    )
    assert out["coef"].isna().all() and out["r2"].isna().all()
    assert set(out["reason"]) == {"n=4 <= 4 (parameters + 1)"}


# --------------------------------------------------------------------------- partial correlation
def test_partial_correlation_matches_numpy_residuals():
    table = make_table(n=11, seed=5)
    cov = ["log10_params", "n_layers"]
    A = np.column_stack([np.ones(len(table)), table[cov].to_numpy()])

    def resid(v: np.ndarray) -> np.ndarray:
        return v - A @ np.linalg.lstsq(A, v, rcond=None)[0]

    r = np.corrcoef(resid(table["coupling"].to_numpy()), resid(table["score"].to_numpy()))[0, 1]
    n, df = len(table), len(table) - 2 - len(cov)
    p = 2 * sps.t.sf(abs(r * np.sqrt(df / (1 - r**2))), df)
    out = row(crossmodel.partial_correlation(table, covariates=cov), subset="all")
    assert out["r"] == pytest.approx(r, abs=1e-10)
    assert out["df"] == df == 7
    assert out["p"] == pytest.approx(p, rel=1e-8)
    assert (out["ci_low"], out["ci_high"]) == pytest.approx(
        fisher(r, 1 / np.sqrt(n - 3 - len(cov))), abs=1e-10
    )


def test_partial_correlation_small_base_subset_reason():
    table = make_table(n=8)
    out = row(crossmodel.partial_correlation(table, covariates=("log10_params",)), subset="base")
    assert out["n"] == 4 and np.isnan(out["r"]) and out["reason"] == "n=4 < 5 (4 + covariates)"


# --------------------------------------------------------------------------- per-model coupling
def test_model_coupling_mean_ci_and_seed():
    ds = make_coupling()
    ds["coupling"][0, 0, 0, 0, 0, 2, :3] = np.nan  # model m0, trained, authors, ujv, p, k=10
    a = crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=500, seed=7))
    b = crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=500, seed=7))
    c = crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=500, seed=8))
    raw = ds["coupling"].sel(reading="authors", variant="ujv", norm="p", k=10)
    expect = raw.sel(model="m0", init="trained").values
    assert float(a["coupling"].sel(model="m0", init="trained")) == pytest.approx(np.nanmean(expect))
    assert int(a["n_prompts"].sel(model="m0", init="trained")) == 7
    assert (a["coupling_low"] <= a["coupling"]).all() and (
        a["coupling"] <= a["coupling_high"]
    ).all()
    xr.testing.assert_identical(a, b)
    assert not np.allclose(a["coupling_low"], c["coupling_low"])
    arc = raw.sel(model="m1", init="random").values[::2]
    assert float(
        a["coupling_by_source"].sel(model="m1", init="random", source="arc")
    ) == pytest.approx(arc.mean())
    assert a["coupling_by_source"].dims == ("model", "init", "source")


def test_bootstrap_ci_is_percentile_of_resampled_means():
    values = np.array(
        [0.1, 0.2, 0.2, 0.3, 0.4, 0.5, 3.0, 6.0, np.nan]
    )  # skewed: percentile != basic CI
    mean, low, high, n = core.bootstrap_mean(values, 4000, 0.95, np.random.default_rng(0))
    finite = values[:-1]
    means = finite[np.random.default_rng(1).integers(0, 8, (20000, 8))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    assert n == 8 and mean == pytest.approx(finite.mean())
    assert low == pytest.approx(lo, abs=0.05) and high == pytest.approx(hi, abs=0.1)
    assert abs(high - (2 * mean - lo)) > 0.3  # the "basic" interval would fail the check above
    few = np.array([2.0, 1.0, 3.0, 2.0, np.nan])  # 4 finite values: no bootstrap interval
    assert core.bootstrap_mean(few, 100, 0.95, np.random.default_rng(0)) == pytest.approx(
        (2.0, np.nan, np.nan, 4), nan_ok=True
    )


def test_model_coupling_rejects_unknown_k():
    with pytest.raises(ValueError, match="k=7"):
        crossmodel.model_coupling(make_coupling(), Selection(k=7))


# --------------------------------------------------------------------------- model table
def test_model_table_scores_and_metadata():
    ds = make_coupling()
    mc = crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=100))
    evaluation = xr.Dataset(
        {"bits_per_byte": (("model", "init"), [[1.0, 3.0], [0.9, 3.1], [0.8, 3.0], [0.7, 3.2]])},
        coords={"model": ["m0", "m1", "m2", "m3"], "init": ["trained", "random"]},
    )
    leaderboard = crossmodel.model_table(mc)
    assert leaderboard["score"].tolist()[:1] == [40.0] and np.isnan(leaderboard["score"].iloc[1])
    assert leaderboard["log10_params"].tolist() == pytest.approx([8, 9, 10, 11])
    assert np.isnan(leaderboard["log10_train_tokens"].iloc[0])
    assert leaderboard["base"].tolist() == [True, False, True, False]
    bpb = crossmodel.model_table(mc, evaluation.isel(model=[3, 2, 1, 0]), score="bits_per_byte")
    assert bpb["score"].tolist() == pytest.approx([-1.0, -0.9, -0.8, -0.7])
    assert set(bpb["score_name"]) == {"neg_bits_per_byte"}
    with pytest.raises(ValueError, match="score must be"):
        crossmodel.model_table(mc, evaluation, score="accuracy")


def test_k_sweep_matches_correlation_at_each_k():
    ds = make_coupling(n_models=6)
    table = crossmodel.model_table(crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=50)))
    out = crossmodel.k_sweep(ds, table, methods=("pearson",), subsets=("all",))
    assert out["k"].tolist() == [1, 5, 10]
    for k in (1, 5, 10):
        x = (
            ds["coupling"]
            .sel(init="trained", reading="authors", variant="ujv", norm="p", k=k)
            .mean("prompt")
            .values
        )
        y = table["score"].to_numpy()
        keep = np.isfinite(y)
        assert row(out, k=k)["r"] == pytest.approx(np.corrcoef(x[keep], y[keep])[0, 1], abs=1e-12)
        assert row(out, k=k)["n"] == 5


def test_family_subsets_reach_every_table_analysis():
    """A family of >= 4 models gets its own subset in correlations, OLS, partial r and the K
    sweep, computed on that family's rows only."""
    ds = make_coupling(n_models=6)
    table = crossmodel.model_table(crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=50)))
    table["family"] = ["grid"] * 5 + ["other"]
    subsets = crossmodel.table_subsets(table)
    assert subsets == ("all", "base", "pretrained", "family:grid")
    sweep = crossmodel.k_sweep(ds, table, methods=("pearson",), subsets=subsets)
    grid = table[table["family"] == "grid"].dropna(subset=["score"])
    x = ds["coupling"].sel(init="trained", reading="authors", variant="ujv", norm="p", k=5)
    x = x.mean("prompt").to_series().reindex(grid["model"]).to_numpy()
    got = sweep[(sweep["subset"] == "family:grid") & (sweep["k"] == 5)].iloc[0]
    assert got["n"] == len(grid)
    assert got["r"] == pytest.approx(np.corrcoef(x, grid["score"])[0, 1], abs=1e-12)
    for frame in (
        crossmodel.correlations(table, subsets=subsets),
        crossmodel.ols_fits(table, subsets=subsets),
        crossmodel.partial_correlation(table, subsets=subsets),
    ):
        assert "family:grid" in set(frame["subset"])


def test_grid_runs_are_never_pooled_with_pretrained_models():
    """With runs of a training grid (group != model) beside pretrained models, no subset of the
    exploratory tables mixes the two; the calibrated measures get their own rows."""
    ds = make_coupling(n_models=6)
    table = crossmodel.model_table(crossmodel.model_coupling(ds, boot=Bootstrap(n_boot=50)))
    table["family"] = ["grid"] * 4 + ["A", "B"]
    table["group"] = ["g-1", "g-1", "g-2", "g-3"] + list(table["model"][4:])
    table["coupling_excess"] = table["coupling"] + 0.1
    subsets = crossmodel.table_subsets(table)
    assert subsets == ("pretrained", "family:grid")
    frame = crossmodel.correlations(
        table, predictors=crossmodel.table_predictors(table), subsets=subsets
    )
    pretrained = frame[frame["subset"] == "pretrained"]
    assert (pretrained["n"] <= 2).all()  # the two pretrained models only
    assert set(frame["predictor"]) >= {"coupling", "coupling_excess"}
    assert (frame[frame["subset"] == "family:grid"]["n"] <= 3).all()  # 3 configurations
    table["group"] = table["model"]  # pretrained models only: every subset as before
    assert crossmodel.table_subsets(table) == ("all", "base", "pretrained", "family:grid")


# --------------------------------------------------------------------------- checkpoints
def make_checkpoints() -> tuple[xr.Dataset, pd.DataFrame, xr.Dataset]:
    """Checkpoint suite: coupling/adjacent_coupling (model, step, ..., prompt), history,
    trajectories."""
    ds = make_coupling(n_models=2, n_prompts=4).isel(init=0, drop=True)
    ds = ds.expand_dims(step=[0, 10, 100]).transpose("model", "step", ...)
    ds["coupling"] = ds["coupling"] * (1 - np.log1p(ds["step"]) / 10)
    ds["adjacent_coupling"] = ds["coupling"] / 2
    history = pd.DataFrame(
        {
            "model": ["m0", "m0", "m0", "m1", "m1"],
            "step": [0, 10, 100, 10, 100],
            "val_loss": [10.0, 6.0, 4.0, 5.0, 3.0],
        }
    )
    rng = np.random.default_rng(0)
    traj = xr.Dataset(
        {
            v: (("model", "step", "prompt", "token"), rng.uniform(1, 2, (2, 3, 4, 5)))
            for v in ("lss", "expodistance")
        },
        coords={
            "model": ["m0", "m1"],
            "step": [0, 10, 100],
            "prompt": ds["prompt"].values,
            "token": np.arange(5),
        },
    )
    return ds, history, traj


def test_checkpoint_table_and_correlations():
    ds, history, traj = make_checkpoints()
    table = checkpoints.checkpoint_table(ds, history, traj, boot=Bootstrap(n_boot=200))
    assert len(table) == 6 and list(table["step"][:3]) == [0, 10, 100]
    got = row(table, model="m1", step=10)
    cell = ds["coupling"].sel(model="m1", step=10, reading="authors", variant="ujv", norm="p", k=10)
    assert got["coupling"] == pytest.approx(float(cell.mean()))
    assert np.isnan(got["coupling_low"]) and np.isnan(got["coupling_high"])  # 4 prompts < 5
    assert got["adjacent_coupling"] == pytest.approx(float(cell.mean()) / 2)
    assert got["lss"] == pytest.approx(float(traj["lss"].sel(model="m1", step=10).mean()))
    assert got["neg_val_loss"] == -5.0 and got["group"] == "m1" and got["n_prompts"] == 4
    assert np.isnan(row(table, model="m1", step=0)["val_loss"])
    corr = checkpoints.checkpoint_correlations(table, methods=("pearson",))
    assert set(corr["design"]) == {
        "within run",
        checkpoints.COMBINED,
        checkpoints.STEP_EFFECTS,
    }
    assert row(corr, subset="m0", predictor="coupling")["reason"] == "n=3 < 4"
    assert "all" not in set(corr["subset"])  # never one pooled correlation of all checkpoints
    finite = corr.dropna(subset=["p"])
    assert (finite["p_holm"] >= finite["p"] - 1e-15).all()


def test_mixed_slope_recovers_the_within_group_slope():
    """Groups with very different intercepts and a common slope: the MixedLM slope equals the
    fixed-effects (group dummies) OLS slope, while a pooled fit is far off."""
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(6), 8)
    x = rng.normal(size=groups.size) + 3 * groups  # x drifts with the group...
    y = 0.5 * x - 4.0 * groups + rng.normal(scale=0.1, size=groups.size)  # ...intercepts fall
    data = pd.DataFrame({"x": x, "y": y, "g": groups})
    got = core.mixed_slope(data, "y", "x", "g")
    dummies = pd.get_dummies(data["g"], prefix="g", dtype=float)
    fixed = sm.OLS(data["y"], pd.concat([data[["x"]], dummies], axis=1)).fit()
    per_sd = fixed.params["x"] * data["x"].std(ddof=1)
    assert got["coef"] == pytest.approx(per_sd, rel=2e-2)
    assert got["ci_low"] < got["coef"] < got["ci_high"] and got["n_groups"] == 6
    pooled = np.polyfit(data["x"], data["y"], 1)[0] * data["x"].std(ddof=1)
    assert abs(pooled - per_sd) > 0.5 * abs(per_sd)
    assert "too few" in core.mixed_slope(data[data["g"] == 0], "y", "x", "g")["reason"]


def test_holm_by_hand():
    p = np.array([0.01, 0.04, np.nan, 0.03])
    np.testing.assert_allclose(core.holm(p), [0.03, 0.06, np.nan, 0.06])


def test_emergence_summary_describes_each_curve():
    table = pd.DataFrame(
        {
            "model": ["a"] * 4 + ["b"] * 4,
            "group": ["g"] * 8,
            "step": [0, 10, 100, 400] * 2,
            "coupling": [-1.0, -0.5, -0.7, -0.8, -1.0, -0.9, -0.8, -0.6],
            "coupling_low": [np.nan, -0.55, np.nan, np.nan, np.nan, np.nan, np.nan, -0.65],
            "coupling_high": [np.nan, -0.45, np.nan, np.nan, np.nan, np.nan, np.nan, -0.55],
        }
    )
    out = checkpoints.emergence_summary(table).set_index("model")
    assert out.loc["a", "peak_step"] == 10 and out.loc["a", "rise"] == pytest.approx(0.5)
    assert out.loc["a", "decline"] == pytest.approx(0.3)
    assert out.loc["b", "peak_step"] == 400 and out.loc["b", "decline"] == 0
    assert "shape" not in out  # no verdict from an argmax judged against its own interval


def test_k_above_rank_flags_the_emergence_claims_from_checkpoint_suites():
    ds, history, traj = make_checkpoints()
    rank = np.full((2, 3, ds.sizes["prompt"], 3), 10.0)
    rank[1, 2] = 2.0  # m1 at step 100: median rank 2 < K = 4
    ds["effective_rank"] = (("model", "step", "prompt", "layer"), rank)
    table = checkpoints.checkpoint_table(ds, history, traj, boot=Bootstrap(n_boot=0))
    assert row(table, model="m1", step=100)["effective_rank"] == 2.0
    flags, warnings = calibration.rank_flags(None, table, 4)
    text = warnings["checkpoint suites"]
    assert "1 of 2 checkpoint run(s) at step(s) 100" in text and "lowest 2.0" in text
    assert flags["emergence_relaxation"] == text and flags["emergence_final_vs_init"] == text
    assert "fixed_size_trained_vs_random" not in flags
    assert calibration.rank_flags(None, table, 2) == ({}, {})


def test_checkpoint_table_drops_steps_a_model_never_had():
    """Combined checkpoint files are the union of the models' steps (NaN elsewhere)."""
    ds, history, traj = make_checkpoints()
    for name in ("coupling", "adjacent_coupling"):
        ds[name] = ds[name].where(~((ds["model"] == "m1") & (ds["step"] == 0)))
    table = checkpoints.checkpoint_table(ds, history, traj, boot=Bootstrap(n_boot=50))
    assert len(table) == 5
    assert [(m, s) for m, s in zip(table["model"], table["step"])] == [
        ("m0", 0),
        ("m0", 10),
        ("m0", 100),
        ("m1", 10),
        ("m1", 100),
    ]


# --------------------------------------------------------------------------- writers
def test_atomic_writers_round_trip(tmp_path):
    table = make_table()
    paths = [
        core.write_table(crossmodel.correlations(table), tmp_path / "csv" / "corr.csv"),
        core.write_table(table, tmp_path / "csv" / "table.csv"),
    ]
    assert [p.name for p in paths] == ["corr.csv", "table.csv"]
    pd.testing.assert_frame_equal(pd.read_csv(paths[1]), table, check_dtype=False)
    mc = crossmodel.model_coupling(make_coupling(), boot=Bootstrap(n_boot=50))
    nc = io.write_netcdf(mc, tmp_path / "nc" / "model_coupling.nc")
    with xr.open_dataset(nc) as back:
        np.testing.assert_allclose(back["coupling"], mc["coupling"])
        assert back.attrs["k"] == 10
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "corr.csv",
        "csv",
        "model_coupling.nc",
        "nc",
        "table.csv",
    ]


# Coupling and minus the validation loss at 5 checkpoints of 8 runs (a default run): every run
# falls from 8.3 to ~5.1 nats, so their intercepts do not differ and MixedLM's CI is NaN.
RUN_COUPLING = [
    -0.972, -0.9747, -0.9519, -0.9582, -0.9548, -0.9731, -0.9141, -0.9562, -0.9545, -0.9611,
    -0.9719, -0.8974, -0.8875, -0.9284, -0.9158, -0.9667, -0.8916, -0.8572, -0.8759, -0.9076,
    -0.9736, -0.8537, -0.8765, -0.9077, -0.8909, -0.9737, -0.8413, -0.8587, -0.8808, -0.9013,
    -0.9672, -0.8463, -0.8308, -0.8455, -0.8792, -0.9653, -0.8397, -0.7972, -0.8796, -0.8932,
]  # fmt: skip
RUN_NEG_LOSS = [
    -8.328, -6.688, -5.765, -5.267, -5.012, -8.333, -6.65, -5.797, -5.256, -5.015,
    -8.322, -7.326, -5.99, -5.481, -5.251, -8.326, -7.363, -5.957, -5.384, -5.166,
    -8.351, -6.683, -5.908, -5.376, -5.104, -8.318, -6.648, -5.838, -5.282, -5.016,
    -8.325, -7.316, -6.02, -5.505, -5.264, -8.323, -7.321, -6.0, -5.42, -5.195,
]  # fmt: skip


def test_mixed_slope_falls_back_to_group_clustered_ols_at_zero_group_variance():
    """MixedLM leaves the CI undefined at a zero random-intercept variance; the slope then comes
    from OLS with run-clustered standard errors (the same point estimate a zero variance gives)."""
    data = pd.DataFrame({"x": RUN_COUPLING, "y": RUN_NEG_LOSS, "g": np.repeat(np.arange(8), 5)})
    got = core.mixed_slope(data, "y", "x", "g")
    assert "clustered" in got["reason"]
    z = (data["x"] - data["x"].mean()) / data["x"].std(ddof=1)
    ols = sm.OLS(data["y"], sm.add_constant(z)).fit(
        cov_type="cluster", cov_kwds={"groups": data["g"]}, use_t=True
    )
    assert "t(7)" in got["reason"]  # 8 runs: t with G - 1 = 7 df, not the normal
    assert got["coef"] == pytest.approx(ols.params["x"], rel=1e-9)
    low, high = ols.conf_int().loc["x"]
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((low, high), rel=1e-9)


def test_the_cross_model_claim_never_pools_the_runs_trained_here() -> None:
    from blockcoupling.stats import crossmodel

    rng = np.random.default_rng(0)
    pretrained = pd.DataFrame(
        {"model": ["a", "b"], "group": ["a", "b"], "family": ["A", "B"], "base": True}
    )
    grid = pd.DataFrame(
        {
            "model": [f"run{i}-s{s}-final" for i in range(4) for s in range(2)],
            "group": [f"run{i}" for i in range(4) for _ in range(2)],
            "family": "grid",
            "base": True,
        }
    )
    table = pd.concat([pretrained, grid], ignore_index=True)
    table["coupling"], table["score"] = rng.normal(size=len(table)), rng.normal(size=len(table))
    subsets = dict(crossmodel.subset_frames(table, ("all", "pretrained")))
    assert list(subsets["pretrained"]["model"]) == ["a", "b"]
    assert len(subsets["all"]) == 2 + 4  # the grid's seeds averaged per configuration
    correlations = crossmodel.correlations(
        table, predictors=("coupling",), subsets=("all", "pretrained")
    )
    row = crossmodel.analysis_rows(correlations)
    assert row["n"].iloc[0] == 2 and np.isnan(row["estimate"].iloc[0])  # too few: no number
