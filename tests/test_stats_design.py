"""The default's primary design (docs/design_default.md): the within-run test of "coupling
grows with performance" and the power of the verdict's decision rule (t and wild bootstrap)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats as sps

from blockcoupling.stats import checkpoints, claims, inference, pilot_power, power
from blockcoupling.stats.selection import Bootstrap, Selection


def suites(rng, n_runs: int, follows_loss: bool, prompts: int = 6):
    """Checkpoint suites, half of whose validation loss turns up after step 64 (overfit runs).
    The excess either follows minus validation loss (``follows_loss``) or training time
    (log step) alone."""
    steps = np.array([0, 4, 16, 64, 128, 256, 512, 768, 1000])
    models = [f"s{i}" for i in range(n_runs)]
    rows, values = [], np.zeros((n_runs, len(steps), prompts))
    for i, model in enumerate(models):
        overfit = i % 2 == 1
        loss = 7.5 - 2.5 * np.log1p(steps) / np.log1p(1000)
        if overfit:
            loss = loss + np.where(steps > 64, 1.2 * (np.log1p(steps) - np.log1p(64)), 0.0)
        driver = -loss if follows_loss else np.log1p(steps)
        driver = (driver - driver.mean()) / driver.std()
        values[i] = 0.05 * driver[:, None] + rng.normal(scale=0.06, size=(len(steps), prompts))
        means = values[i].mean(axis=1)
        rows += [
            dict(model=model, step=s, coupling_excess=means[j], neg_val_loss=-loss[j])
            for j, s in enumerate(steps)
        ]
    cube = xr.Dataset(
        {"coupling_excess": (("model", "step", "prompt"), values)},
        coords=dict(model=models, step=steps, family=("model", ["emergence"] * n_runs)),
    )
    return cube, pd.DataFrame(rows)


def test_within_run_row_separates_performance_from_training_time():
    """The within-run primary row exists, its unit is the run (each its own init), and it is
    positive when the excess follows validation loss, and not when it follows the step alone
    (the overfit runs, where loss turns up, pull it down)."""
    rng = np.random.default_rng(0)
    out = {}
    for follows in (True, False):
        cube, table = suites(rng, 10, follows)
        frame = checkpoints.emergence_analyses(
            cube, table, Selection(), boot=Bootstrap(n_boot=20), primary=["emergence_within_loss"]
        ).set_index("analysis")
        out[follows] = frame.loc["emergence_within_loss"]
    tracks, timer = out[True], out[False]
    assert tracks["n"] == 10 and tracks["unit"] == "initialization (10 runs)"
    assert tracks["ci_low"] > 0 and tracks["p"] < 0.001 and tracks["p_wild"] < 0.01
    assert timer["estimate"] < tracks["estimate"] - 1  # half its runs go the other way
    assert bool(tracks["primary"])


def test_within_loss_z_is_the_fisher_z_of_spearman_after_step_zero():
    rows = pd.DataFrame(
        dict(
            step=[0, 1, 2, 3, 4, 5],
            coupling_excess=[9.0, 0.1, 0.3, 0.2, 0.5, 0.4],
            neg_val_loss=[-9.0, -5, -4, -3, -2, -1],
        )
    )
    rho = sps.spearmanr([0.1, 0.3, 0.2, 0.5, 0.4], [-5, -4, -3, -2, -1]).statistic
    assert checkpoints.within_loss_z(rows) == pytest.approx(np.arctanh(rho))
    assert np.isnan(checkpoints.within_loss_z(rows.iloc[:4]))  # 3 checkpoints after step 0


def test_within_run_claim_is_listed_and_declarable():
    from blockcoupling.stats.hypotheses import HYPOTHESES

    assert "emergence_within_loss" in HYPOTHESES
    assert claims.claim_of("emergence_within_loss").startswith("Within a run")


def test_decision_power_sees_the_wild_bootstrap_floor():
    """6 units: the sign-flip bootstrap's p is at least 2/64, so no study passes alpha = 0.01
    whatever the effect; the t test's power alone (the old resources/power.csv) said 0.82+."""
    rng = np.random.default_rng(1)
    pilot = rng.normal(scale=0.02, size=6)
    se = pilot.std(ddof=1) / np.sqrt(6)
    assert power.simulated_power(0.05, se, 5, 0.01) > 0.8
    assert pilot_power.decision_power(pilot, 0.05, 6, 0.01, n_sim=50) == 0.0
    assert pilot_power.decision_power(pilot, 0.05, 10, 0.0125, n_sim=100) > 0.9


def test_decision_power_matches_the_t_test_when_the_bootstrap_has_room():
    """Many units and a normal pilot: the decision rule's power is the t test's (within MC
    error), at the effect the pilot's spread is scaled to."""
    pilot = np.random.default_rng(2).normal(size=400)
    pilot = (pilot - pilot.mean()) / pilot.std(ddof=1)
    got = pilot_power.decision_power(pilot, 0.5, 30, 0.0125, n_sim=300, draws=999)
    expected = power.simulated_power(0.5, 1 / np.sqrt(30), 29, 0.0125)
    assert got == pytest.approx(expected, abs=0.1)


def test_slope_decision_power_rises_with_n_and_is_alpha_under_no_effect():
    rng = np.random.default_rng(3)
    x = rng.normal(size=20)
    y = 0.4 * x + rng.normal(size=20)
    small = pilot_power.slope_decision_power(x, y, 0.5, 15, 0.0125, n_sim=150, draws=199)
    large = pilot_power.slope_decision_power(x, y, 0.5, 90, 0.0125, n_sim=150, draws=199)
    assert large > 0.85 > 0.5 > small
    null = pilot_power.slope_decision_power(x, y, 1e-9, 30, 0.05, n_sim=300, draws=199)
    assert null < 0.1


def test_claims_verdict_uses_the_decision_power_column():
    """A declared test with the new power table row: inconclusive says its decision power."""
    row = inference.analysis_row(
        "emergence_within_loss",
        "initialization (10 runs)",
        10,
        "t",
        0.1,
        -0.2,
        0.4,
        0.5,
        p_wild=0.6,
    )
    table = inference.combine_analyses([inference.analysis_table([row])], ["emergence_within_loss"])
    pilot = pd.DataFrame(
        [dict(analysis="emergence_within_loss", effect=0.5, power=0.9, alpha=0.0125)]
    )
    out = claims.claims_table(
        table, {"emergence_within_loss": {"effect": 0.5, "source": "x"}}, pilot
    )
    got = out.set_index("claim").loc[claims.claim_of("emergence_within_loss")]
    assert got["power"] == 0.9 and got["verdict"].startswith("inconclusive: powered (0.90)")


def _fixed_size_table(overlap: float):
    rows = [
        inference.analysis_row(
            "fixed_size_excess_vs_bpb",
            "run (20 configurations)",
            20,
            "OLS",
            0.6,
            0.4,
            0.8,
            1e-5,
            "CR1 by group, t(19)",
            p_wild=1e-4,
        ),
        inference.analysis_row(
            "fixed_size_overlap_u_vs_bpb",
            "run (20 configurations)",
            20,
            "OLS",
            overlap,
            overlap - 0.2,
            overlap + 0.2,
            0.01,
            "CR1 by group, t(19)",
            p_wild=0.01,
        ),
    ]
    table = inference.combine_analyses(
        [inference.analysis_table(rows)], ["fixed_size_excess_vs_bpb"]
    )
    declared = {"fixed_size_excess_vs_bpb": {"effect": 0.5, "source": "r = 0.5"}}
    out = claims.claims_table(table, declared).set_index("claim")
    return out.loc[claims.claim_of("fixed_size_excess_vs_bpb")]


def test_across_runs_primary_is_reproduced_only_when_the_overlap_agrees_in_sign():
    assert _fixed_size_table(0.5)["verdict"] == "reproduced"
    disagree = _fixed_size_table(-0.5)["verdict"]
    assert disagree.startswith("inconclusive: significant, but fixed_size_overlap_u_vs_bpb")


def test_claims_print_the_runs_own_power_beside_the_pilots():
    """power_achieved: the run's power at the declared effect from its own interval and df,
    at Holm's first threshold; 0 for 6 units (the wild bootstrap's floor 2/64 > 0.05/m)."""
    row = _fixed_size_table(0.5)
    se = 0.4 / (2 * sps.t.ppf(0.975, 19))
    assert row["power_achieved"] == pytest.approx(power.simulated_power(0.5, se, 19, 0.05))
    few = inference.analysis_row(
        "emergence_final_vs_init",
        "initialization (6 runs)",
        6,
        "t",
        0.1,
        0.08,
        0.12,
        1e-5,
        "one-sample t(5) over initializations",
        p_wild=0.03,
    )
    table = inference.combine_analyses([inference.analysis_table([few])], ["a", "b"])
    declared = {
        "emergence_final_vs_init": {"effect": 0.05, "source": "x"},
        "emergence_within_loss": {"effect": 0.5, "source": "y"},
    }
    out = claims.claims_table(table, declared).set_index("claim")
    assert out.loc[claims.claim_of("emergence_final_vs_init"), "power_achieved"] == 0.0


def test_n_for_power_is_the_smallest_n_reaching_the_target():
    assert power.n_for_power(lambda n: n / 100, 1, 200) == 80
    assert np.isnan(power.n_for_power(lambda n: 0.1, 1, 50))


def test_pilot_power_reads_the_pilot_tables_at_the_designs_steps():
    """blockcoupling pilot power: one row per declared primary, at the design's n and Holm's
    first threshold, from per-unit pilot values (within-run z at the config's steps only)."""
    from blockcoupling.stats import pilot_power as pilot

    rng = np.random.default_rng(4)
    steps = [0, 4, 16, 64, 256, 1000]
    within = pd.DataFrame(
        [
            dict(
                run=f"w{i}",
                step=s,
                val_loss=7 - np.log1p(s) / 3,
                excess_k2=0.01 * np.log1p(s) + rng.normal(scale=0.01),
            )
            for i in range(4)
            for s in steps
        ]
    )
    across = pd.DataFrame(
        dict(
            excess_k2=rng.normal(size=8),
            val_loss=rng.normal(size=8) + 5,
            tok_self_k2=rng.normal(0.3, 0.02, 8),
            twin_tok_self_k2=rng.normal(0.4, 0.02, 8),
        )
    )
    units = pilot.pilot_units(within, across, 2, [0, 4, 16, 64, 256])
    assert units["emergence_within_loss"].shape == (4,)
    declared = {
        "emergence_within_loss": {"effect": 0.5},
        "emergence_final_vs_init": {"effect": 0.05},
        "tokens_self_trained_vs_random": {"effect": 0.05},
        "fixed_size_excess_vs_bpb": {"effect": 0.5},
    }
    n = {
        "emergence_within_loss": 10,
        "emergence_final_vs_init": 10,
        "tokens_self_trained_vs_random": 20,
        "fixed_size_excess_vs_bpb": 20,
    }
    table = pilot.power_table(units, declared, n, n_sim=40).set_index("analysis")
    assert set(table.index) == set(declared) and (table["alpha"] == 0.0125).all()
    assert table["power"].between(0, 1).all() and (table["pilot_n"] > 0).all()
    assert table.loc["tokens_self_trained_vs_random", "pilot_estimate"] == pytest.approx(
        (across["tok_self_k2"] - across["twin_tok_self_k2"]).mean()
    )
