"""Run-level inference: cluster-robust slopes with t(G-1), t over runs, sign tests, Holm over
primaries, claims; simulated data with known effects and nulls, few clusters."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats as sps

from blockcoupling.files.io import replace_marked_block
from blockcoupling.stats import (
    checkpoints,
    claims,
    core,
    crossmodel,
    fixed_size,
    inference,
    power,
    vit,
)
from blockcoupling.stats.hypotheses import HYPOTHESES
from blockcoupling.stats.selection import Bootstrap, Selection


def clustered(rng: np.random.Generator, slope: float, groups: int = 8, per: int = 4):
    """Rows of (g, x, y) with cluster effects in both x and y (so rows are not independent)."""
    g = np.repeat(np.arange(groups), per)
    x = rng.normal(size=groups)[g] + rng.normal(size=g.size)
    y = slope * x + 2 * rng.normal(size=groups)[g] + rng.normal(size=g.size)
    return pd.DataFrame({"g": g, "x": x, "y": y})


def test_cluster_slope_is_cr1_with_t_of_g_minus_1_by_hand():
    data = clustered(np.random.default_rng(0), 0.5, groups=7, per=5)
    got = inference.cluster_slope(data, "y", "x", "g")
    X = np.column_stack([np.ones(len(data)), data["x"]])
    beta, *_ = np.linalg.lstsq(X, data["y"], rcond=None)
    u = data["y"] - X @ beta
    bread = np.linalg.inv(X.T @ X)
    meat = sum(np.outer(X[m].T @ u[m], X[m].T @ u[m]) for m in (data["g"] == k for k in range(7)))
    n, k, G = len(data), 2, 7
    cov = G / (G - 1) * (n - 1) / (n - k) * bread @ meat @ bread
    se = np.sqrt(cov[1, 1])
    half = sps.t.ppf(0.975, G - 1) * se
    assert got["estimate"] == pytest.approx(beta[1])
    assert got["ci_low"] == pytest.approx(beta[1] - half)
    assert got["ci_high"] == pytest.approx(beta[1] + half)
    assert got["p"] == pytest.approx(2 * sps.t.sf(abs(beta[1] / se), G - 1))
    assert got["n"] == 35 and got["n_clusters"] == 7 and "t(6)" in got["note"]


def test_cluster_slope_gives_no_interval_below_five_clusters():
    data = clustered(np.random.default_rng(1), 0.5, groups=4, per=6)
    got = inference.cluster_slope(data, "y", "x", "g")
    assert np.isfinite(got["estimate"])
    assert np.isnan(got["ci_low"]) and np.isnan(got["p"]) and "4 clusters < 5" in got["note"]


@pytest.mark.filterwarnings("ignore:The design matrix is rank-deficient")  # the collinear pair
def test_a_slope_the_data_cannot_separate_from_a_covariate_has_no_estimate():
    """x equal to a covariate's multiple (or to a fixed effect's levels): OLS by pseudo-inverse
    would still print a finite slope (the minimum-norm split); none is reported. Two collinear
    covariates beside an x they do not span leave x's slope identified: it equals OLS on the
    reduced design (one of the two covariates), by hand."""
    data = clustered(np.random.default_rng(2), 0.5, groups=8, per=4)
    same = data.assign(z=2 * data["x"] + 1)
    got = inference.cluster_slope(same, "y", "x", "g", covariates=["z"])
    assert np.isnan(got["estimate"]) and np.isnan(got["p"]) and "not identified" in got["note"]
    levels = data.assign(x=data["g"] % 2, f=data["g"] % 2)  # x is the fixed effect's dummy
    got = inference.cluster_slope(levels, "y", "x", "g", fixed=["f"])
    assert np.isnan(got["estimate"]) and "not identified" in got["note"]
    rng = np.random.default_rng(3)
    pair = data.assign(z=rng.normal(size=len(data)))
    pair = pair.assign(w=3 * pair["z"])
    got = inference.cluster_slope(pair, "y", "x", "g", covariates=["z", "w"])
    X = np.column_stack([np.ones(len(pair)), pair["x"], pair["z"]])
    assert got["estimate"] == pytest.approx(np.linalg.lstsq(X, pair["y"], rcond=None)[0][1])
    assert np.isfinite(got["p"])


@pytest.mark.parametrize("slope", [0.0, 0.7])
def test_cluster_slope_intervals_cover_at_their_nominal_rate(slope):
    """8 clusters of 4 rows with cluster effects: the 95% interval covers the true slope in
    about 95% of 200 seeded simulations (naive OLS covers far less); under the null it rejects
    in about 5%."""
    rng = np.random.default_rng(2)
    cover = naive = 0
    for _ in range(200):
        data = clustered(rng, slope)
        got = inference.cluster_slope(data, "y", "x", "g")
        cover += got["ci_low"] <= slope <= got["ci_high"]
        fit = sps.linregress(data["x"], data["y"])
        half = sps.t.ppf(0.975, len(data) - 2) * fit.stderr
        naive += fit.slope - half <= slope <= fit.slope + half
    assert 0.89 <= cover / 200 <= 0.99
    assert naive / 200 < cover / 200 - 0.05  # the design's clustering matters


def test_run_level_test_matches_scipy_t_and_sign_tests():
    values = np.array([0.3, 0.5, -0.1, 0.6, 0.2, 0.4, np.nan])
    got = inference.run_level_test(values)
    finite = values[np.isfinite(values)]
    ref = sps.ttest_1samp(finite, 0.0)
    low, high = ref.confidence_interval(0.95)
    assert got["n"] == 6 and got["estimate"] == pytest.approx(finite.mean())
    assert got["p"] == pytest.approx(ref.pvalue)
    assert (got["ci_low"], got["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert got["p_sign"] == pytest.approx(sps.binomtest(5, 6).pvalue)
    few = inference.run_level_test([0.2, 0.9, 0.4])
    assert np.isnan(few["ci_low"]) and np.isnan(few["p"]) and "[0.2, 0.9]" in few["note"]


def test_spearman_of_plus_minus_one_has_no_clipped_interval():
    got = core.correlate([1, 2, 3, 4, 5], [2, 4, 6, 8, 10], "spearman")
    assert (
        got["r"] == pytest.approx(1) and np.isnan(got["ci_low"]) and "no Fisher-z" in got["reason"]
    )


def test_combined_correlation_uses_initializations_as_units():
    """Its n counted checkpoints (38) and its t ran over runs: runs that share an init (two
    learning rates at one seed) are one unit, their r averaged first; n = initializations."""
    r = [0.5, 0.7, 0.8, -0.2, 0.0, 0.4, 0.6, 0.3, np.nan]
    runs = pd.DataFrame(
        {
            "r": r,
            "n": [7, 7, 13, 6, 6, 6, 6, 6, 3],
            "init": ["a", "a", "b", "c", "c", "d", "e", "f", "f"],
        }
    )
    got = checkpoints.combined_correlation(runs)
    units = [0.6, 0.8, -0.1, 0.4, 0.6, 0.3]
    ref = sps.ttest_1samp(units, 0.0)
    low, high = ref.confidence_interval(0.95)
    assert got["r"] == pytest.approx(np.mean(units)) and got["p"] == pytest.approx(ref.pvalue)
    assert (got["ci_low"], got["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert got["n"] == 6 and got["n_runs"] == 8 and got["n_checkpoints"] == 57
    assert got["unit"] == "initialization (8 runs)" and "t(5) over initializations" in got["reason"]
    ones = np.ones((6, 1))
    assert got["p_wild"] == pytest.approx(inference.wild_cluster_p(units, ones, 0, np.arange(6)))


def test_checkpoint_tests_over_runs_take_initializations_as_units():
    """10 runs from 5 inits (two learning rates per seed, identical step-0 values): the
    checkpoint correlations, the trend and the step-fixed-effects slopes have 5 units, not 10
    runs or 50 checkpoints."""
    rng = np.random.default_rng(3)
    steps = np.array([0, 4, 16, 64, 256])
    models = [f"lr{lr}-s{s}" for s in range(5) for lr in (1, 4)]
    values = rng.normal(size=(10, 5, 6)) + np.linspace(0, 1, 5)[None, :, None]
    values[1::2, 0] = values[0::2, 0]  # runs of one seed share their init
    cube = xr.Dataset(
        {
            "coupling": (("model", "step", "prompt"), values),
            "adjacent_coupling": (("model", "step", "prompt"), values / 2),
            "coupling_excess": (("model", "step", "prompt"), values - 0.5),
        },
        coords=dict(model=models, step=steps, family=("model", ["emergence"] * 10)),
    )
    history = pd.DataFrame(
        [
            dict(model=m, step=int(s), val_loss=float(5 - i * 0.3 + rng.normal(scale=0.2)))
            for m in models
            for i, s in enumerate(steps)
        ]
    )
    table = checkpoints.checkpoint_table(cube, history, boot=Bootstrap(n_boot=0))
    assert table.groupby("init")["model"].nunique().tolist() == [2] * 5
    corr = checkpoints.checkpoint_correlations(table, methods=("pearson",))
    combined = corr[corr["design"] == checkpoints.COMBINED].set_index("predictor")
    fixed = corr[corr["design"] == checkpoints.STEP_EFFECTS].set_index("predictor")
    for pred in ("coupling", "adjacent_coupling", "coupling_excess"):  # the excess has rows
        within = corr[(corr["design"] == "within run") & (corr["predictor"] == pred)]
        per_init = within.assign(init=[m.split("-")[1] for m in within["subset"]])
        expected = per_init.groupby("init")["r"].mean()
        assert combined.loc[pred, "n"] == 5 and combined.loc[pred, "n_checkpoints"] == 50
        assert combined.loc[pred, "r"] == pytest.approx(expected.mean())
        assert combined.loc[pred, "p"] == pytest.approx(sps.ttest_1samp(expected, 0).pvalue)
        assert fixed.loc[pred, "n"] == 5 and "t(4)" in fixed.loc[pred, "reason"]
    emergence = checkpoints.emergence_analyses(
        cube, table, Selection(), "coupling_excess", Bootstrap(n_boot=0)
    ).set_index("analysis")
    for name in ("emergence_trend", "emergence_loss_slope", "emergence_peak_vs_init"):
        assert emergence.loc[name, "n"] == 5, name
    assert emergence.loc["emergence_trend", "unit"] == "initialization (10 runs)"
    within = corr[corr["design"] == "within run"]  # one run's checkpoints: a time series
    assert within["r"].notna().all() and within[["p", "ci_low", "ci_high"]].isna().all().all()
    tested = corr.dropna(subset=["p"])
    assert set(tested["design"]) == {checkpoints.COMBINED, checkpoints.STEP_EFFECTS}
    assert tested["p_holm"].notna().all() and len(tested) == 6
    assert "t(4)" in emergence.loc["emergence_loss_slope", "note"]


def test_holm_runs_over_the_declared_primaries_alone():
    rows = [
        inference.analysis_row(name, "run", 10, "m", 1.0, 0.5, 1.5, p)
        for name, p in [("a", 0.01), ("b", 0.04), ("c", 0.001), ("d", 0.03)]
    ]
    frames = [inference.analysis_table(rows[:2]), inference.analysis_table(rows[2:])]
    got = inference.combine_analyses(frames, ["a", "b", "d"]).set_index("analysis")
    assert list(got.columns) == list(inference.ANALYSIS_COLUMNS)[1:]
    np.testing.assert_allclose(got.loc[["a", "b", "d"], "p_holm"], [0.03, 0.06, 0.06])
    assert np.isnan(got.loc["c", "p_holm"]) and not got.loc["c", "primary"]


def test_a_primary_verdict_needs_cr1_and_the_wild_bootstrap_to_agree():
    # a: CR1 p 0.001 but wild p 0.09 (they disagree); b: both small
    rows = [
        inference.analysis_row(n, "run", 10, "m", 1.0, 0.5, 1.5, p, p_wild=w)
        for n, p, w in [
            ("emergence_final_vs_init", 0.001, 0.09),
            ("emergence_relaxation", 0.01, 0.005),
        ]
    ]
    got = inference.combine_analyses(
        [inference.analysis_table(rows)], ["emergence_final_vs_init", "emergence_relaxation"]
    )
    np.testing.assert_allclose(got["p_holm"], [0.09, 0.02])  # Holm over the larger p of each
    table = claims.claims_table(got, ("emergence_final_vs_init", "emergence_relaxation"))
    by = {c.analysis: row for c, (_, row) in zip(claims.CLAIMS, table.iterrows())}
    a, b = by["emergence_final_vs_init"], by["emergence_relaxation"]
    assert a["p"] == 0.001 and a["p_wild"] == 0.09
    assert a["verdict"].startswith("inconclusive: the t test (p = 0.001) and the wild cluster")
    assert b["verdict"].startswith("reproduced (Holm-level interval [")
    assert "| 0.001 | 0.09 | 0.09 |" in claims.claims_markdown(table, "abc")
    explored = claims.verdict(pd.Series(dict(rows[0], primary=False)), +1)
    assert explored == "exploratory: the paper's direction, p = 0.001, wild p = 0.09 unadjusted"


def test_the_tests_disagree_when_only_holm_over_the_larger_p_separates_them():
    # the default's emergence rows: t p ~1e-4, wild p 2/64 (its floor with 6 runs): both below
    # 0.05 unadjusted, but Holm over the larger p of four primaries is not
    rows = [
        inference.analysis_row(n, "run", 6, "m", 0.11, 0.086, 0.135, p, p_wild=0.03125)
        for n, p in [
            ("emergence_final_vs_init", 8.7e-5),
            ("emergence_relaxation", 4.5e-4),
            ("emergence_locality", 6.1e-5),
            ("tokens_self", 1.4e-4),
        ]
    ]
    primary = (
        "emergence_final_vs_init",
        "emergence_relaxation",
        "emergence_locality",
        "tokens_self",
    )
    got = inference.combine_analyses([inference.analysis_table(rows)], primary)
    assert (got["p_holm"] >= 0.05).all()
    table = claims.claims_table(got, primary)
    verdict = table.loc[table["claim"] == claims.claim_of("emergence_final_vs_init"), "verdict"]
    assert verdict.iloc[0].startswith(
        "inconclusive: the t test (p = 8.7e-05) and the wild cluster bootstrap (p = 0.031) "
        "disagree about significance (Holm p 0.00026 from the t tests, 0.12 from the larger p)"
    ), verdict.iloc[0]


def test_refuted_only_at_the_papers_scale():
    # emergence_relaxation: the paper's claim is about Pythia 6.9B/12B over 143k steps
    rows = [inference.analysis_row("emergence_relaxation", "run", 6, "t", -0.1, -0.15, -0.05, 1e-4)]
    analyses = inference.combine_analyses(
        [inference.analysis_table(rows)], ["emergence_relaxation"]
    )
    table = claims.claims_table(analyses, ("emergence_relaxation",))
    got = table.loc[table["claim"] == claims.claim_of("emergence_relaxation"), "verdict"].iloc[0]
    assert got.startswith("not reproduced in this design: the opposite direction")
    assert "Pythia 6.9B and 12B over 143k steps" in got and "refuted" not in got
    refuted = claims.verdict(analyses.iloc[0], +1)  # a design at the paper's scale
    assert refuted.startswith("refuted (Holm-level interval [")
    assert all(c.scale for c in claims.CLAIMS if c.analysis.startswith(("emergence", "vit")))


def test_no_effect_of_the_declared_size_only_from_a_declared_tost():
    from statsmodels.stats.weightstats import DescrStatsW

    # vit_sd_effect's estimate and 95% t(15) interval: those of a sample of 16 (independent
    # TOST: statsmodels' ttost_mean on that sample)
    x = np.random.default_rng(5).normal(-0.011, 0.07, 16)
    x = -0.011 + (x - x.mean()) * 0.0175 / (x.std(ddof=1) / 4)  # mean -0.011, se 0.0175
    sample = DescrStatsW(x)
    low, high = sample.tconfint_mean(0.05)
    rows = [
        inference.analysis_row(
            "vit_sd_effect", "run", 20, "OLS", x.mean(), low, high, 0.54, note="sd; df=15"
        ),
        inference.analysis_row("emergence_final_vs_init", "run", 6, "t", 0.1, 0.08, 0.12, 0.004),
    ]
    declared = {
        "vit_sd_effect": {"effect": 0.05, "source": "s", "equivalence": 0.05},
        "emergence_final_vs_init": {"effect": 0.05, "source": "s"},
    }
    got = inference.combine_analyses([inference.analysis_table(rows)], declared)
    got = got.set_index("analysis")
    tost = got.loc["vit_sd_effect_equivalence"]
    assert tost["p"] == pytest.approx(sample.ttost_mean(-0.05, 0.05)[0]) and tost["primary"]
    ids = ["vit_sd_effect", "emergence_final_vs_init", "vit_sd_effect_equivalence"]
    np.testing.assert_allclose(got.loc[ids, "p_holm"], core.holm([0.54, 0.004, tost["p"]]))
    assert tost["p_holm"] < 0.05  # 0.021 x 2
    table = claims.claims_table(got.reset_index(), declared)
    row = table[table["claim"] == claims.claim_of("vit_sd_effect")].iloc[0]
    assert row["verdict"].startswith(
        "not reproduced in this design: no effect of the declared size (TOST"
    )
    assert "declared equivalence: TOST" in row["limits"]
    # the same interval without a declared bound: no equivalence verdict
    undeclared = {k: {"effect": 0.05, "source": "s"} for k in declared}
    plain = claims.claims_table(got.drop(index=ids[2]).reset_index(), undeclared)
    verdict = plain[plain["claim"] == claims.claim_of("vit_sd_effect")].iloc[0]["verdict"]
    assert "no effect" not in verdict


SIGNIFICANT = dict(estimate=0.5, ci_low=0.2, ci_high=0.8, p=0.01, p_holm=0.02, n=10)
NULL = dict(estimate=0.01, ci_low=-0.04, ci_high=0.06, p=0.6, p_holm=0.9, n=10)


@pytest.mark.parametrize(
    ("row", "primary", "sign", "effect", "power", "expected"),
    [
        (None, True, 1, 0.1, 0.9, "not testable with this design"),
        (SIGNIFICANT, True, 1, 0.1, 0.9, "reproduced"),
        (SIGNIFICANT, True, -1, 0.1, 0.9, "refuted"),
        (SIGNIFICANT | dict(p_holm=0.08), True, 1, 0.1, 0.3, "inconclusive: underpowered (0.30"),
        (SIGNIFICANT | dict(p_holm=0.08), True, 1, 0.1, 0.9, "inconclusive: Holm-level interval"),
        (NULL, True, 1, 0.1, 0.3, "inconclusive: underpowered"),  # no declared TOST
        (NULL, True, 1, 0.05, 0.3, "inconclusive: underpowered"),
        (
            NULL | dict(ci_low=np.nan, ci_high=np.nan),
            True,
            1,
            0.1,
            0.9,
            "inconclusive: no interval",
        ),
        (NULL, True, 1, 0.1, np.nan, "inconclusive: its power at the declared effect is unknown"),
        # powered, not significant: the Holm-level interval (here m = 1: the 95% one) holds both
        # 0 and the declared effect (inconclusive), or excludes the effect: the one-sided t test
        # of H0: effect >= E (t(9), se = 0.1 / (2 t_0.975(9)) = 0.0221) decides
        (
            NULL,
            True,
            1,
            0.05,
            0.9,
            "inconclusive: the Holm-level interval [-0.04, 0.06] holds both 0",
        ),
        (
            NULL,
            True,
            1,
            0.1,
            0.9,
            "not reproduced at the declared size 0.1 (one-sided p = 0.0014, Holm p = 0.0014; "
            "Holm-level interval [-0.04, 0.06]; power 0.90)",
        ),
        (NULL, True, -1, 0.03, 0.9, "inconclusive: the Holm-level interval [-0.04, 0.06] holds"),
        (
            NULL,
            True,
            -1,
            0.05,
            0.9,
            "not reproduced at the declared size 0.05 (one-sided p = 0.012",
        ),
        # exploratory rows: a direction and an unadjusted p, never reproduced / refuted
        (SIGNIFICANT, False, 1, np.nan, np.nan, "exploratory: the paper's direction, p = 0.01"),
        (SIGNIFICANT, False, -1, np.nan, np.nan, "exploratory: opposite, p = 0.01"),
        (NULL, False, 1, np.nan, np.nan, "exploratory: no direction (interval holds 0), p = 0.6"),
        (dict(NULL, ci_low=np.nan, p=np.nan), False, 1, np.nan, np.nan, "exploratory: estimate"),
    ],
)
def test_claim_verdicts_say_no_more_than_the_evidence(row, primary, sign, effect, power, expected):
    series = None if row is None else pd.Series(row | {"primary": primary})
    got = claims.verdict(series, sign, effect, power)
    assert got.startswith(expected)
    if not primary:
        assert "reproduced" not in got and "refuted" not in got


def test_claims_table_carries_declared_effect_power_and_flags():
    rows = [
        inference.analysis_row(
            "emergence_final_vs_init", "initialization", 6, "t", 0.02, -0.01, 0.03, 0.2
        ),
        inference.analysis_row(
            "fixed_size_excess_vs_bpb_rank_adjusted", "run", 20, "t", 0.3, 0.1, 0.5, 0.01
        ),
    ]
    analyses = inference.combine_analyses(
        [inference.analysis_table(rows)], ["emergence_final_vs_init"]
    )
    declared = {"emergence_final_vs_init": {"effect": 0.05, "source": "pilot"}}
    power = pd.DataFrame(
        {
            "analysis": ["emergence_final_vs_init"],
            "effect": [0.05],
            "power": [0.93],
            "alpha": [0.05],
        }
    )
    flags = {"fixed_size_excess_vs_bpb_rank_adjusted": "stats.k = 8 is above ..."}
    table = claims.claims_table(analyses, declared, power, flags)
    by = {c.analysis: row for c, (_, row) in zip(claims.CLAIMS, table.iterrows())}
    final = by["emergence_final_vs_init"]
    assert final["primary"] and final["effect"] == 0.05 and final["power"] == 0.93
    # 0.02 [-0.01, 0.03] over 6 excludes the declared 0.05: the one-sided test says so
    assert final["verdict"].startswith("not reproduced at the declared size 0.05 (one-sided p")
    low = claims.claims_table(analyses, declared, power.assign(power=0.3, n_for_target=40))
    row = low[low["claim"] == final["claim"]].iloc[0]
    assert row["power"] == 0.3 and "80% needs 40 units" in row["limits"]
    fixed = by["fixed_size_excess_vs_bpb_rank_adjusted"]
    assert not fixed["primary"] and fixed["verdict"].startswith("exploratory: the paper's")
    assert "stats.k = 8" in fixed["limits"] and np.isnan(fixed["power"])
    # a pilot power at another effect is not used
    stale = claims.claims_table(
        analyses, {"emergence_final_vs_init": {"effect": 0.1, "source": "x"}}, power
    )
    assert np.isnan(stale.loc[stale["claim"] == final["claim"], "power"]).all()


def test_claims_markdown_goes_between_the_readme_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{claims.START}\nstale text\n{claims.END}\nrest\n")
    table = claims.claims_table(inference.combine_analyses([], []))
    text = replace_marked_block(
        readme.read_text(),
        readme,
        claims.START,
        claims.END,
        claims.claims_markdown(table, "abc123"),
    )
    assert "stale text" not in text and "`abc123`" in text and text.endswith("rest\n")
    assert text.count("not testable with this design") == 2 * len(claims.CLAIMS)  # table, prose
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="claims:start"):
        replace_marked_block(readme.read_text(), readme, claims.START, claims.END, "x")


# --------------------------------------------------------------------------- fixed size
def fixed_size_data(rng, configs: int, seeds: int, slope: float, excess: bool = True):
    """Synthetic combined coupling (model, init, prompt) of a fixed-size grid: -bpb rises with
    the held-out excess by ``slope`` per unit; two pretrained models outside the family."""
    runs = [(c, s) for c in range(configs) for s in range(seeds)]
    names = [f"c{c}-s{s}-final" for c, s in runs] + ["pre-a", "pre-b"]
    level = rng.normal(size=len(names))
    prompts = 6
    source = np.array(["shakespeare"] * 3 + ["tasks"] * 3)
    values = level[:, None, None] + 0.1 * rng.normal(size=(len(names), 2, prompts))
    coords = dict(
        model=names,
        init=["trained", "random"],
        prompt=np.arange(prompts),
        family=("model", ["fixed_size"] * len(runs) + ["hub", "hub"]),
        group=("model", [f"c{c}" for c, _ in runs] + ["pre-a", "pre-b"]),
        prompt_source=("prompt", source),
    )
    dims = ("model", "init", "prompt")
    data = {"coupling": (dims, values - 1)}
    if excess:
        data["coupling_excess"] = (dims, values)
    ds = xr.Dataset(data, coords=coords)
    held = values[:, 0, :3].mean(axis=1)
    bpb = -(slope * held + 0.05 * rng.normal(size=len(names)))
    evaluation = xr.Dataset(
        {"bits_per_byte": (("model", "init"), np.column_stack([bpb, bpb + 3]))},
        coords=dict(model=names, init=["trained", "random"]),
    )
    histories = {
        name: pd.DataFrame({"step": [0, 10], "train_loss": [5, 2], "val_loss": [5, 2.5 + i]})
        for i, name in enumerate(names)
    }
    return ds, evaluation, histories


def test_fixed_size_recovers_a_known_effect_with_runs_as_units():
    ds, evaluation, histories = fixed_size_data(np.random.default_rng(3), 6, 3, 0.8)
    runs = fixed_size.run_table(ds, evaluation, histories, {})
    assert len(runs) == 18 and not runs["model"].str.startswith("pre").any()  # never pooled
    assert runs["gap"].iloc[1] == pytest.approx(1.5)
    out = fixed_size.analyses(runs, ("fixed_size_excess_vs_bpb",)).set_index("analysis")
    main = out.loc["fixed_size_excess_vs_bpb"]
    assert main["primary"] and main["n"] == 18 and main["unit"] == "run (6 configurations)"
    # standardized slope of z on z = Pearson's r of the runs
    r = np.corrcoef(runs["coupling_excess_held_out"], runs["neg_bpb"])[0, 1]
    assert main["estimate"] == pytest.approx(r) and main["ci_low"] > 0 and main["p"] < 0.01
    config = out.loc["fixed_size_excess_vs_bpb_config_spearman"]
    assert config["n"] == 6 and config["unit"] == "configuration" and not config["primary"]
    assert set(out.index) <= set(HYPOTHESES)
    twin = out.loc["fixed_size_trained_vs_random"]  # both inits share the level: ~0
    assert (
        twin["n"] == 6 and twin["unit"] == "configuration" and twin["ci_low"] < 0 < twin["ci_high"]
    )
    diff = ds["coupling_excess"].isel(prompt=slice(0, 3)).mean("prompt")
    diff = (diff.sel(init="trained") - diff.sel(init="random")).values[:18]
    assert twin["estimate"] == pytest.approx(diff.mean())


def test_fixed_size_reports_missing_measures_and_too_few_configurations():
    ds, evaluation, histories = fixed_size_data(np.random.default_rng(4), 4, 2, 0.8, False)
    runs = fixed_size.run_table(ds, evaluation, histories, {})
    out = fixed_size.analyses(runs).set_index("analysis")
    assert (
        "not measured: coupling_excess_held_out absent"
        in out.loc["fixed_size_excess_vs_bpb", "note"]
    )
    raw = out.loc["fixed_size_coupling_vs_bpb"]
    assert np.isfinite(raw["estimate"]) and np.isnan(raw["ci_low"]) and np.isnan(raw["p"])
    assert "4 clusters < 5" in raw["note"]


def test_no_analysis_reports_a_p_from_fewer_units_than_it_claims():
    """Every finite p or interval of every family's table comes with n >= 5 units of its kind."""
    rng = np.random.default_rng(5)
    ds, evaluation, histories = fixed_size_data(rng, 5, 2, 0.5)
    tables = [fixed_size.analyses(fixed_size.run_table(ds, evaluation, histories, {}))]
    for n_runs in (3, 6):
        cube, table = emergence_data(rng, n_runs, trend=0.3)
        tables.append(
            checkpoints.emergence_analyses(cube, table, Selection(), boot=Bootstrap(n_boot=50))
        )
    tables.append(vit.vit_analyses(vit_runs(rng, seeds=4, effect=0.1)))
    frame = inference.combine_analyses(tables, [])
    finite = frame[np.isfinite(frame["p"]) | np.isfinite(frame["ci_low"])]
    assert len(finite) > 20
    clusters = finite["unit"].str.extract(r"\((\d+) configurations\)")[0].astype(float)
    units = clusters.fillna(finite["n"])
    assert (units >= inference.MIN_CLUSTERS).all(), finite[units < 5]


# --------------------------------------------------------------------------- emergence
def emergence_data(rng, n_runs: int, trend: float, prompts: int = 10):
    """Checkpoint suites (model, step, prompt) whose excess rises by ``trend`` per log step."""
    steps = np.array([0, 3, 10, 30, 100, 300])
    models = [f"r{i}" for i in range(n_runs)]
    base = trend * np.log1p(steps)[None, :, None]
    values = base + rng.normal(size=(n_runs, 1, prompts)) + rng.normal(size=(n_runs, 6, prompts))
    cube = xr.Dataset(
        {"coupling_excess": (("model", "step", "prompt"), values)},
        coords=dict(model=models, step=steps, family=("model", ["emergence"] * n_runs)),
    )
    means = values.mean(axis=2)
    table = pd.DataFrame(
        [
            dict(model=m, step=s, coupling_excess=means[i, j], neg_val_loss=means[i, j] + j)
            for i, m in enumerate(models)
            for j, s in enumerate(steps)
        ]
    )
    return cube, table


def test_emergence_trend_and_step_fixed_effects_slope():
    cube, table = emergence_data(np.random.default_rng(6), 6, trend=0.5)
    out = checkpoints.emergence_analyses(
        cube, table, Selection(), boot=Bootstrap(n_boot=50)
    ).set_index("analysis")
    trend = out.loc["emergence_trend"]
    assert trend["n"] == 6 and trend["unit"] == "initialization (6 runs)" and trend["ci_low"] > 0
    slope = out.loc["emergence_loss_slope"]  # neg_val_loss = excess + step effect: slope 1/sd
    sd = table["coupling_excess"].std(ddof=1)
    assert slope["estimate"] == pytest.approx(sd, rel=1e-6) and slope["n"] == 6
    per_run = [i for i in out.index if i.startswith("emergence_peak_vs_init:")]
    assert len(per_run) == 6 and (out.loc[per_run, "n"] == 5).all()


def test_emergence_claims_are_paired_over_initializations_not_runs():
    """6 runs from 3 inits (two learning rates per seed: identical step-0 values): each claim's
    test has 3 units, and its estimate is the mean over inits of the runs' mean difference."""
    rng = np.random.default_rng(12)
    steps = np.array([0, 4, 16, 64, 256])
    models = [f"lr{lr}-s{s}" for s in range(3) for lr in (1, 4)]
    values = rng.normal(size=(6, 5, 8))
    values[1::2, 0] = values[0::2, 0]  # runs of one seed share their init
    adjacent = values + rng.normal(size=values.shape)
    adjacent[1::2, 0] = adjacent[0::2, 0]
    cube = xr.Dataset(
        {
            "coupling_excess": (("model", "step", "prompt"), values),
            "adjacent_excess": (("model", "step", "prompt"), adjacent),
        },
        coords=dict(model=models, step=steps, family=("model", ["emergence"] * 6)),
    )
    assert len(set(checkpoints.init_blocks(cube["coupling_excess"]).values())) == 3
    rows = checkpoints.paired_claims(cube, models, Selection(), peak_step=16)
    out = inference.analysis_table(rows).set_index("analysis")
    means, local = values.mean(axis=2), (adjacent - values).mean(axis=2)
    expected = {
        "emergence_final_vs_init": means[:, -1] - means[:, 0],
        "emergence_relaxation": means[:, -1] - means[:, 2],
        "emergence_locality": (local[:, -1] - local[:, 0]),
    }
    for name, per_run in expected.items():
        row = out.loc[name]
        assert row["n"] == 3 and row["unit"] == "initialization (6 runs)"
        assert row["estimate"] == pytest.approx(per_run.reshape(3, 2).mean(axis=1).mean())
        assert np.isnan(row["p"]) and "3 initializations < 5" in row["note"]  # a range only
    # 6 distinct inits: t(5) over inits, the scipy t interval, and a wild bootstrap p beside it
    distinct = cube.assign(coupling_excess=cube["coupling_excess"] + rng.normal(size=(6, 1, 1)))
    row = pd.DataFrame(
        checkpoints.paired_claims(distinct, models, Selection(), peak_step=None)
    ).iloc[0]
    diffs = distinct["coupling_excess"].mean("prompt").values
    diffs = diffs[:, -1] - diffs[:, 0]
    test = sps.ttest_1samp(diffs, 0)
    interval = test.confidence_interval()
    assert row["n"] == 6 and "t(5)" in row["note"] and row["p"] == pytest.approx(test.pvalue)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((interval.low, interval.high))
    assert 1 / 64 <= row["p_wild"] <= 1
    relax = pd.DataFrame(
        checkpoints.paired_claims(distinct, models, Selection(), peak_step=None)
    ).iloc[1]
    assert relax["n"] == 0 and "stats.peak_step" in relax["note"]


def test_wild_cluster_bootstrap_matches_refitting_statsmodels_for_every_sign_vector():
    import itertools

    import statsmodels.formula.api as smf

    rng = np.random.default_rng(13)
    data = pd.DataFrame({"g": np.repeat(np.arange(6), 3), "x": rng.normal(size=18)})
    data["y"] = 0.3 * data["x"] + rng.normal(size=18) + np.repeat(rng.normal(size=6), 3)
    fit = inference.cluster_slope(data, "y", "x", "g")
    cluster = dict(cov_type="cluster", cov_kwds={"groups": data["g"]}, use_t=True)
    t = smf.ols("y ~ x", data).fit(**cluster).tvalues["x"]
    null = smf.ols("y ~ 1", data).fit()
    t_star = [
        smf.ols("y ~ x", data.assign(y=null.fittedvalues + null.resid * np.array(signs)[data["g"]]))
        .fit(**cluster)
        .tvalues["x"]
        for signs in itertools.product([-1, 1], repeat=6)
    ]
    assert fit["p_wild"] == pytest.approx(np.mean(np.abs(t_star) >= abs(t) - 1e-12))
    assert fit["p"] < 0.05 < fit["p_wild"]  # 6 clusters: the bootstrap is the more cautious


def test_scipy_intervals_are_the_hand_formulas():
    values = np.random.default_rng(14).normal(0.3, 1, size=9)
    test = inference.run_level_test(values)
    half = sps.t.ppf(0.975, 8) * values.std(ddof=1) / 3
    assert (test["ci_low"], test["ci_high"]) == pytest.approx(
        (values.mean() - half, values.mean() + half), abs=1e-14
    )
    x, y = np.arange(10.0), np.random.default_rng(15).normal(size=10)
    row = core.correlate(x, y)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(core.fisher_ci(row["r"], 10), abs=1e-14)


def test_power_simulation_is_the_noncentral_t():
    for effect, se, df in ((0.05, 0.02, 5), (0.3, 0.15, 9), (0.01, 0.02, 14)):
        alpha = 0.01
        crit = sps.t.ppf(1 - alpha / 2, df)
        exact = sps.nct.sf(crit, df, effect / se) + sps.nct.cdf(-crit, df, effect / se)
        assert power.simulated_power(effect, se, df, alpha) == pytest.approx(exact, abs=0.012)
    pilot = pd.DataFrame(
        [dict(analysis="a", estimate=0.1, ci_low=0.0, ci_high=0.2, n=10, note="x; t(9)")]
    )
    table = power.pilot_power(pilot, {"a": {"effect": 0.1}, "b": {"effect": 1}}).set_index(
        "analysis"
    )
    assert table.loc["a", "alpha"] == 0.025 and table.loc["a", "pilot_df"] == 9
    se = 0.1 / sps.t.ppf(0.975, 9)
    assert table.loc["a", "pilot_se"] == pytest.approx(se)
    assert table.loc["a", "power"] == pytest.approx(power.simulated_power(0.1, se, 9, 0.025))
    n = table.loc["a", "n_for_target"]  # the smallest n with 80%: one fewer has less
    assert power.simulated_power(0.1, se * np.sqrt(10 / n), 9 + n - 10, 0.025) >= 0.8
    assert power.simulated_power(0.1, se * np.sqrt(10 / (n - 1)), 8 + n - 10, 0.025) < 0.8
    assert np.isnan(table.loc["b", "power"])


def test_power_of_a_cr1_test_counts_clusters_not_runs():
    # a CR1 pilot: 20 runs in 10 configurations, t(9); the design's units are clusters (df G - 1)
    se = 0.2
    half = se * sps.t.ppf(0.975, 9)
    note = "y ~ x; CR1 by group, t(9)"
    pilot = pd.DataFrame(
        [dict(analysis="a", estimate=0.1, ci_low=0.1 - half, ci_high=0.1 + half, n=20, note=note)]
    )
    row = power.pilot_power(pilot, {"a": {"effect": 0.5}}, {"a": 40}).set_index("analysis").loc["a"]
    assert row["pilot_n"] == 10 and row["n"] == 40 and row["df"] == 39
    crit = sps.t.ppf(1 - 0.05 / 2, 39)
    exact = sps.nct.sf(crit, 39, 0.5 / (se * np.sqrt(10 / 40))) + sps.nct.cdf(
        -crit, 39, 0.5 / (se * np.sqrt(10 / 40))
    )
    assert row["power"] == pytest.approx(exact, abs=0.012)
    g = int(row["n_for_target"])  # the smallest number of clusters with 80%, at G - 1 df
    assert power.simulated_power(0.5, se * np.sqrt(10 / g), g - 1, 0.05) >= 0.8
    assert power.simulated_power(0.5, se * np.sqrt(10 / (g - 1)), g - 2, 0.05) < 0.8


def test_split_half_peak_has_no_selection_bias_under_the_null():
    """Flat curves (pure noise): the argmax of all prompts' means is biased above the first
    step; the peak chosen on one half and measured on the other is not."""
    rng = np.random.default_rng(7)
    split, naive = [], []
    for i in range(200):
        values = xr.DataArray(
            rng.normal(size=(6, 10)), dims=("step", "prompt"), coords={"step": np.arange(6)}
        )
        split.append(checkpoints._split_half_peak(values, 10, i, "m", 0.95)["init"][0])
        means = values.mean("prompt").values
        naive.append(means.max() - means[0])
    assert abs(np.mean(split)) < 3 * np.std(split) / np.sqrt(200)
    assert np.mean(naive) > 10 * np.std(naive) / np.sqrt(200)


# --------------------------------------------------------------------------- ViT
def vit_runs(rng, seeds: int, effect: float) -> pd.DataFrame:
    """Per-run table of a sweep: 5 rates x ``seeds`` seeds at one weight decay."""
    rows = [dict(sd=sd, wd=0.05, seed=s) for sd in (0.0, 0.1, 0.2, 0.3, 0.4) for s in range(seeds)]
    runs = pd.DataFrame(rows)
    block = rng.normal(size=seeds)[runs["seed"]]
    runs["coupling_excess"] = effect * runs["sd"] + block + 0.01 * rng.normal(size=len(runs))
    runs["coupling"] = runs["coupling_excess"] - 1
    runs["test_accuracy"] = (
        0.9 + 0.05 * (runs["coupling_excess"] - runs["sd"]) + 0.01 * rng.normal(size=len(runs))
    )
    return runs


def test_vit_sd_effect_has_seed_as_a_block_and_accuracy_a_within_rate_slope():
    runs = vit_runs(np.random.default_rng(8), seeds=4, effect=0.5)
    out = vit.vit_analyses(runs, ("vit_sd_effect",)).set_index("analysis")
    X = np.column_stack([np.ones(20), runs["sd"], *(runs["seed"] == s for s in (1, 2, 3))])
    beta = np.linalg.lstsq(X, runs["coupling_excess"], rcond=None)[0]
    effect = out.loc["vit_sd_effect"]
    assert effect["estimate"] == pytest.approx(beta[1]) and effect["n"] == 20
    assert effect["primary"] and "C(seed)" in effect["note"] and "df=15" in effect["note"]
    within = out.loc["vit_accuracy_within_rate"]
    assert "C(sd)" in within["note"] and "C(seed)" in within["note"]
    assert "not measured" in out.loc["vit_sd_effect_overlap_u", "note"]


def test_vit_sd_effect_carries_the_wild_bootstrap_by_seed_and_the_verdict_takes_both():
    """Its p_wild: the restricted wild cluster bootstrap by seed, here every one of the 2^4 sign
    vectors refitted by statsmodels with CR1 errors by seed; Holm takes the larger p.
    """
    import statsmodels.formula.api as smf

    rng = np.random.default_rng(11)
    runs = vit_runs(rng, seeds=4, effect=0.02)
    runs["coupling_excess"] += 0.05 * rng.normal(size=len(runs))  # a weak slope: p's differ
    row = vit.vit_analyses(runs).set_index("analysis").loc["vit_sd_effect"]
    formula = "coupling_excess ~ sd + C(seed)"
    cluster = dict(cov_type="cluster", cov_kwds={"groups": runs["seed"]})
    t_data = smf.ols(formula, runs).fit(**cluster).tvalues["sd"]
    restricted = smf.ols("coupling_excess ~ C(seed)", runs).fit()
    extreme = 0
    for signs in itertools.product([-1, 1], repeat=4):
        star = runs.assign(
            coupling_excess=restricted.fittedvalues
            + restricted.resid * np.array(signs)[runs["seed"]]
        )
        extreme += abs(smf.ols(formula, star).fit(**cluster).tvalues["sd"]) >= abs(t_data) - 1e-12
    assert row["p_wild"] == pytest.approx(extreme / 16)
    assert "wild cluster bootstrap by seed (4 seeds)" in row["note"]
    assert row["p_wild"] != pytest.approx(row["p"])
    table = inference.combine_analyses([vit.vit_analyses(runs)], ("vit_sd_effect",)).set_index(
        "analysis"
    )
    assert table.loc["vit_sd_effect", "p_holm"] == pytest.approx(max(row["p"], row["p_wild"]))


def test_vit_accuracy_within_rate_blocks_on_seed():
    # seeds shift excess and accuracy in opposite directions; within a seed, accuracy rises
    # 0.05 per unit excess: only a seed block recovers the within-seed slope
    rng = np.random.default_rng(3)
    runs = pd.DataFrame(
        [dict(sd=sd, wd=0.05, seed=s) for sd in (0.0, 0.1, 0.2, 0.3, 0.4) for s in range(4)]
    )
    block = np.array([-1.0, -0.3, 0.4, 1.1])[runs["seed"]]
    within = rng.normal(size=len(runs))
    runs["coupling_excess"] = block + within
    runs["coupling"] = runs["coupling_excess"] - 1
    runs["test_accuracy"] = 0.8 - 0.05 * block + 0.05 * within + 0.001 * rng.normal(size=20)
    row = vit.vit_analyses(runs).set_index("analysis").loc["vit_accuracy_within_rate"]
    z = (runs["coupling_excess"] - runs["coupling_excess"].mean()) / runs["coupling_excess"].std()
    dummies = [runs[c] == v for c in ("sd", "seed") for v in sorted(runs[c].unique())[1:]]
    X = np.column_stack([np.ones(20), z, *dummies])
    beta = np.linalg.lstsq(X, runs["test_accuracy"], rcond=None)[0]
    assert row["estimate"] == pytest.approx(beta[1])
    assert row["estimate"] == pytest.approx(0.05 * runs["coupling_excess"].std(), rel=0.05)
    assert "C(seed)" in row["note"] and "df=11" in row["note"]


def test_vit_rate_intervals_need_five_seeds():
    seeds = 2
    values = np.random.default_rng(9).normal(size=(2, 1, seeds, 3))
    combined = xr.Dataset(
        {"coupling": (("sd", "wd", "seed", "image"), values)},
        coords=dict(sd=[0.0, 0.2], wd=[0.1], seed=np.arange(seeds), image=np.arange(3)),
    )
    out = vit.vit_coupling_by_rate(combined, Selection(k=None), Bootstrap(n_boot=20))
    row = out[(out["sd"] == 0.0) & (out["wd"] == "all")].iloc[0]
    seed_means = values[0].mean(axis=(0, 2))
    assert row["ci_low"] == pytest.approx(seed_means.min())
    assert row["ci_high"] == pytest.approx(seed_means.max())
    assert "range of the seed means" in row["ci_method"]
    five = combined.reindex(seed=np.arange(5))
    five["coupling"].values[:] = np.random.default_rng(10).normal(size=(2, 1, 5, 3))
    row = vit.vit_coupling_by_rate(five, Selection(k=None), Bootstrap(n_boot=30, seed=1)).iloc[0]
    means = vit.crossed_bootstrap_means(
        five["coupling"].sel(sd=0.0).values, 30, core._cell_seed(1, "vit_rate", 0.0, "all")
    )
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(
        tuple(np.quantile(means, [0.025, 0.975]))
    )
    assert "bootstrap" in row["ci_method"]


# --------------------------------------------------------------------------- config
def test_stats_primary_declared_in_config_yaml_with_effects_and_one_line_errors(tmp_path):
    import copy
    from pathlib import Path

    import yaml
    from snakemake.utils import validate

    from blockcoupling.pipeline.checks import check_config
    from blockcoupling.pipeline.errors import ConfigError

    repo = Path(__file__).resolve().parents[1]
    schema = str(repo / "schemas" / "config.schema.yaml")
    default = yaml.safe_load((repo / "config.yaml").read_text())["stats"]["primary"]
    config = yaml.safe_load((repo / "config" / "smoke.yaml").read_text())
    config["stats"].pop("primary", None)
    validate(config, schema)
    # the user reads the design in config.yaml; configs that declare none get the same tests
    assert config["stats"]["primary"] == default and set(default) <= set(HYPOTHESES)
    assert all(v["effect"] > 0 and v["source"] for v in default.values())
    power = pd.read_csv(repo / config["stats"]["power_file"]).set_index("analysis")
    for name, declared in default.items():  # the committed pilot power is for these effects
        assert power.loc[name, "effect"] == pytest.approx(declared["effect"])
    bad = copy.deepcopy(config)
    bad["stats"]["primary"] = {"emergence_trend": {"effect": 1, "source": "x"}}
    bad["stats"]["primary"]["coupling_is_great"] = {"effect": 1, "source": "x"}
    with pytest.raises(ConfigError, match=r"stats.primary .*'coupling_is_great'") as error:
        check_config(bad, repo)
    assert "\n" not in str(error.value)
    bad = copy.deepcopy(config)
    bad["stats"]["power_file"] = str(tmp_path / "none.csv")
    with pytest.raises(ConfigError, match=r"stats.power_file .*blockcoupling pilot power") as error:
        check_config(bad, repo)
    assert "\n" not in str(error.value)
    bad["stats"]["primary"] = ["fixed_size_excess_vs_bpb"]
    with pytest.raises(Exception, match="primary"):
        validate(bad, schema)
    # the declared peak and window must be steps the suites save (smoke: 0, 2, 8)
    for stats, match in (
        (dict(within_window=[2, 5]), r"\[5\] are not checkpoint steps of train.grids.emergence"),
        (dict(within_window=[8, 2]), r"within_window \[8, 2\]: give \[start, end\]"),
        (dict(peak_step=4), r"\[4\] are not checkpoint steps"),
    ):
        bad = copy.deepcopy(config)
        bad["stats"].update(stats)
        with pytest.raises(ConfigError, match=match) as error:
            check_config(bad, repo)
        assert "\n" not in str(error.value)


def test_cross_model_correlations_average_the_seeds_of_a_configuration():
    rng = np.random.default_rng(11)
    groups = np.repeat([f"g{i}" for i in range(6)], 2)
    table = pd.DataFrame(
        {
            "model": [f"{g}-s{i % 2}" for i, g in enumerate(groups)],
            "group": groups,
            "family": "grid",
            "base": False,
            "coupling": rng.normal(size=12),
            "score": rng.normal(size=12),
        }
    )
    got = crossmodel.correlations(table, predictors=("coupling",), subsets=("all",))
    row = got[got["method"] == "pearson"].iloc[0]
    means = table.groupby("group")[["coupling", "score"]].mean()
    assert row["n"] == 6 and row["unit"] == "configuration (seeds averaged)"
    assert row["r"] == pytest.approx(np.corrcoef(means["coupling"], means["score"])[0, 1])


def test_fixed_size_without_such_runs_says_so():
    ds, evaluation, histories = fixed_size_data(np.random.default_rng(12), 3, 2, 0.5)
    ds = ds.assign_coords(family=("model", ["grid"] * ds.sizes["model"]))
    out = fixed_size.analyses(fixed_size.run_table(ds, evaluation, histories, {}))
    assert out["estimate"].isna().all() and (out["n"] == 0).all()
    assert out["note"].str.contains("no runs of family fixed_size").all()


def test_cli_claims_renders_a_runs_table_into_the_readme(tmp_path, capsys):
    from blockcoupling import cli

    (tmp_path / "results" / "stats").mkdir(parents=True)
    (tmp_path / "results" / "stats" / "claims.md").write_text("| table from commit `abc` |\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{claims.START}\nstale\n{claims.END}\nend\n")
    assert cli.main(["claims", str(tmp_path / "results"), "--readme", str(readme)]) == 0
    assert (
        readme.read_text()
        == f"top\n{claims.START}\n| table from commit `abc` |\n{claims.END}\nend\n"
    )
    assert cli.main(["claims", str(tmp_path / "none"), "--readme", str(readme)]) == 2
    assert "stats_claims" in capsys.readouterr().err


def test_token_wise_claims_compare_trained_and_twin_over_configurations():
    from blockcoupling.stats import tokens

    rng = np.random.default_rng(16)
    models = [f"fixed_size-f{g}-s{s}-final" for g in range(6) for s in range(2)] + ["pre"]
    n_tok = 4
    coords = dict(
        model=models,
        init=["trained", "random"],
        token=np.arange(n_tok),
        token_ref=np.arange(n_tok),
        token_in=np.arange(n_tok),
        token_out=np.arange(n_tok),
        family=("model", ["fixed_size"] * 12 + [""]),
        group=("model", [f"g{g}" for g in range(6) for _ in range(2)] + ["pre"]),
    )
    pair = ("model", "init", "prompt", "token", "token_ref")
    self_values = rng.normal(size=(13, 2, 1, n_tok, n_tok))
    self_values[:, 0] += 0.5  # trained above the twin by 0.5 off the diagonal
    context = rng.normal(size=(13, 2, 1, n_tok, n_tok, n_tok))
    data = xr.Dataset(
        {
            "self_excess": (pair, self_values),
            "fixed_in_excess": (
                ("model", "init", "prompt", "token_in", "token", "token_ref"),
                context,
            ),
            "fixed_out_excess": (
                ("model", "init", "prompt", "token_out", "token", "token_ref"),
                context,
            ),
        },
        coords=coords,
    )
    out = tokens.token_analyses(data, {}).set_index("analysis")
    off = ~np.eye(n_tok, dtype=bool)
    diff = self_values[:, 0, 0][:, off].mean(axis=1) - self_values[:, 1, 0][:, off].mean(axis=1)
    row = out.loc["tokens_self_trained_vs_random"]
    assert row["n"] == 6 and row["unit"] == "configuration (12 runs)"
    assert row["estimate"] == pytest.approx(diff[:12].reshape(6, 2).mean(axis=1).mean())
    assert row["ci_low"] > 0 and np.isfinite(row["p_wild"])
    one = out.loc["tokens_self_trained_vs_random:pre"]
    assert one["estimate"] == pytest.approx(diff[12]) and np.isnan(one["ci_low"])
    assert set(i.split(":")[0] for i in out.index) <= set(HYPOTHESES)
    missing = tokens.token_analyses(None, {})
    assert (missing["n"] == 0).all() and missing["note"].str.contains("not measured").all()


def test_readme_states_no_result_by_hand_outside_the_generated_block():
    """The README's statements about results come from ``blockcoupling claims``: outside the
    claims markers its results section names no verdict (the README once said the emergence
    claim "holds" where the table said inconclusive)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    start, end = text.index(claims.START), text.index(claims.END)
    section = text[text.index("## Results of the default run") : start] + text[end:]
    section = section[: section.index("\n## ", 1)]
    words = r"\b(reproduced|refuted|supported|holds|significant|inconclusive|confirm\w*)\b"
    prose = section.replace("calls a claim reproduced, refuted, supported or holding", "")
    found = re.findall(words, prose, re.IGNORECASE)
    assert not found, f"README states results by hand: {found}"


def test_fixed_size_adjusted_slope_removes_a_design_confounder():
    """Coupling and bits per byte both follow the data fraction, not each other: the plain
    slope is large, the design-adjusted one is not (and equals OLS with the covariate)."""
    rng = np.random.default_rng(17)
    fractions = np.repeat([0.02, 0.06, 0.2, 1.0], 6)
    groups = [f"f{f}-wd{w}" for f, w in zip(fractions, np.tile([0, 0, 0, 1, 1, 1], 4))]
    log_f = np.log10(fractions)
    runs = pd.DataFrame(
        {
            "model": [f"m{i}" for i in range(24)],
            "group": groups,
            "data_fraction": fractions,
            "weight_decay": np.tile([0.0, 0.0, 0.0, 1.0, 1.0, 1.0], 4),
            "coupling_excess_held_out": log_f + 0.3 * rng.normal(size=24),
            "neg_bpb": log_f + 0.3 * rng.normal(size=24),
            "gap": rng.normal(size=24),
        }
    )
    out = fixed_size.analyses(runs).set_index("analysis")
    plain, adjusted = (
        out.loc["fixed_size_excess_vs_bpb"],
        out.loc["fixed_size_excess_vs_bpb_adjusted"],
    )
    assert plain["ci_low"] > 0.5 and adjusted["ci_low"] < 0 < adjusted["ci_high"]
    z = lambda v: (v - v.mean()) / v.std(ddof=1)  # noqa: E731
    X = np.column_stack(
        [np.ones(24), z(runs["coupling_excess_held_out"]), log_f, runs["weight_decay"]]
    )
    coef = np.linalg.lstsq(X, z(runs["neg_bpb"]), rcond=None)[0]
    assert adjusted["estimate"] == pytest.approx(coef[1])
    assert "adjusted for the design" in adjusted["method"] and adjusted["n"] == 24


def test_rank_adjusted_slope_separates_coupling_from_the_spectrums_shape():
    """The runs' log effective rank (the median over held-out prompts and blocks of the trained
    model, by hand here) drives -bpb and the excess alike: the plain slope is large, the
    rank-adjusted one is the OLS coefficient of the excess beside z(log rank) (lstsq) and its
    interval holds 0; where -bpb also follows the excess beyond the rank, it recovers that."""
    rng = np.random.default_rng(7)
    ds, evaluation, histories = fixed_size_data(rng, 8, 3, 0.0)
    runs_n = 24
    level = rng.normal(1.5, 0.6, size=(26, 1, 1, 1))  # each model's own spectrum
    rank = np.exp(level + 0.2 * rng.normal(size=(26, 2, 6, 4)))  # (model, init, prompt, layer)
    ds["effective_rank"] = (("model", "init", "prompt", "layer"), rank)
    log_rank = np.log(np.median(rank[:runs_n, 0, :3, :].reshape(runs_n, -1), axis=1))
    noise = 0.3 * rng.normal(size=runs_n)
    excess = log_rank + noise
    ds["coupling_excess"][:runs_n, 0, :3] = excess[:, None]  # the held-out prompts' mean
    z = lambda v: (v - v.mean()) / v.std(ddof=1)  # noqa: E731
    for beyond in (0.0, 1.0):
        bpb = -(log_rank + beyond * noise + 0.2 * rng.normal(size=runs_n))
        evaluation["bits_per_byte"][:runs_n, 0] = bpb
        runs = fixed_size.run_table(ds, evaluation, histories, {})
        assert runs["log_effective_rank_held_out"].to_numpy() == pytest.approx(log_rank)
        out = fixed_size.analyses(runs).set_index("analysis")
        plain = out.loc["fixed_size_excess_vs_bpb"]
        adjusted = out.loc["fixed_size_excess_vs_bpb_rank_adjusted"]
        X = np.column_stack([np.ones(runs_n), z(excess), z(log_rank)])
        coef = np.linalg.lstsq(X, z(-bpb), rcond=None)[0]
        assert adjusted["estimate"] == pytest.approx(coef[1])
        assert "log effective rank" in adjusted["method"] and adjusted["n"] == runs_n
        assert plain["ci_low"] > 0.5
        if beyond:
            assert adjusted["ci_low"] > 0
        else:
            assert adjusted["ci_low"] < 0 < adjusted["ci_high"]


def test_a_sampled_wild_bootstrap_p_counts_the_observed_draw_and_is_never_zero():
    """Beyond 12 clusters the sign vectors are sampled: p = (1 + extreme draws) / (1 + draws),
    never 0 (config/across_runs.yaml's token-wise row, 52 runs and a t of about 4.3, printed
    p_wild = 0 at 9f7fdcf)."""
    rng = np.random.default_rng(21)
    x, groups = np.ones((40, 1)), np.arange(40)
    far = 3.0 + rng.normal(size=40)  # no sign vector but the observed one is as extreme
    assert inference.wild_cluster_p(far, x, 0, groups, draws=199, seed=3) == 1 / 200
    null = rng.normal(size=40)
    p = inference.wild_cluster_p(null, x, 0, groups, draws=199, seed=3)
    extreme = p * 200 - 1
    assert 0 < p <= 1 and extreme == pytest.approx(round(extreme), abs=1e-9)


def test_trained_vs_twin_note_names_configurations_its_unit() -> None:
    """The twin test averages each configuration's seeds first, so its t runs over
    configurations (6 here, from 12 runs): its note must say so, not "over runs".
    """
    from blockcoupling.stats import fixed_size

    rng = np.random.default_rng(0)
    table = pd.DataFrame(
        {"group": np.repeat([f"c{i}" for i in range(6)], 2), "twin_difference": rng.normal(size=12)}
    )
    row = fixed_size._twin_row(table, 0.95)
    assert row["n"] == 6
    assert "t(5) over configurations" in row["note"] and "over runs" not in row["note"]
    few = fixed_size._twin_row(table[table["group"].isin(["c0", "c1"])], 0.95)
    assert few["note"].startswith("2 configurations < ")
