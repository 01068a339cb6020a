"""The default's primary design (docs/design_default.md): the within-run test of "coupling
grows with performance" and the power of the verdict's decision rule (t and wild bootstrap)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats as sps

from blockcoupling.stats import checkpoints, claims, core, inference, pilot_power, power
from blockcoupling.stats.decision_power import Design, decision_power
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
    whatever the effect; the t test's power alone said 0.82+."""
    se = 0.02 / np.sqrt(6)
    assert power.simulated_power(0.05, se, 5, 0.01) > 0.8
    assert decision_power(Design("mean", 0.02), 0.05, 6, 0.01, n_sim=50) == 0.0
    assert decision_power(Design("mean", 0.02), 0.05, 10, 0.0125, n_sim=100) > 0.9


def test_decision_power_matches_the_t_test_when_the_bootstrap_has_room():
    """Many units: the decision rule's power is the t test's (within MC error)."""
    got = decision_power(Design("mean", 1.0), 0.5, 30, 0.0125, n_sim=300, draws=999)
    expected = power.simulated_power(0.5, 1 / np.sqrt(30), 29, 0.0125)
    assert got == pytest.approx(expected, abs=0.1)


def test_pilot_power_draws_at_the_pilots_sd_not_its_units():
    """The issue's case: six pilot values in two clusters (-0.32 x 3, +0.46 x 3). Resampling
    them gave 0.93 at mean z 0.5 over 10 suites; the power model draws normal units at their
    sd, so any pilot with that sd gives the same power (0.78 at the noncentral t)."""
    bimodal = np.array([-0.32, -0.27, -0.32, 0.46, 0.46, 0.46])
    normal = np.random.default_rng(0).normal(size=6)
    normal = normal / normal.std(ddof=1) * bimodal.std(ddof=1)
    tests = [pilot_power._mean_test(v) for v in (bimodal, normal)]
    assert tests[0].design == tests[1].design
    got = decision_power(tests[0].design, 0.5, 10, 0.05 / 3, n_sim=400)
    se = bimodal.std(ddof=1) / np.sqrt(10)
    assert got == pytest.approx(power.simulated_power(0.5, se, 9, 0.05 / 3), abs=0.07)
    assert got < 0.85


def test_slope_decision_power_rises_with_n_and_counts_the_overlaps_sign():
    design = Design("slope", agree_r=0.8)
    small = decision_power(design, 0.5, 15, 0.0125, n_sim=150, draws=199)
    large = decision_power(design, 0.5, 90, 0.0125, n_sim=150, draws=199)
    assert large > 0.85 > 0.5 > small
    null = decision_power(Design("slope"), 1e-3, 30, 0.05, n_sim=300, draws=199)
    assert null < 0.1
    # an overlap that falls with generalization never agrees in sign: no study reproduces
    against = decision_power(Design("slope", agree_r=-0.8), 0.5, 90, 0.0125, n_sim=100, draws=199)
    assert against < 0.05


def test_arms_power_needs_the_manipulation_check():
    design = Design("arms", 1.0, check=(1.0, 0.02))
    assert decision_power(design, 2.0, 12, 0.0125, n_sim=150) > 0.8
    unchecked = Design("arms", 1.0, check=(0.0, 0.02))  # the arms do not part
    assert decision_power(unchecked, 2.0, 12, 0.0125, n_sim=150) < 0.1


def test_claims_verdict_quotes_the_holm_level_interval_the_issue_read_wrong():
    """The default's within-run row at 3729328: 0.136 [-0.205, 0.476] over 10 suites, t(9),
    Holm over 3: its Holm-level interval [-0.306, 0.578] (the issue: 0.577) holds 0.5, so the
    clause "which the interval excludes" was wrong: it is inconclusive, holding both."""
    rows = [
        inference.analysis_row(
            name, "suite", 10, "t", est, low, high, p, "one-sample t(9) over runs", p_wild=p
        )
        for name, est, low, high, p in [
            ("emergence_within_loss", 0.136, -0.205, 0.476, 0.39),
            ("emergence_final_vs_init", 0.09, 0.08, 0.10, 1e-6),
            ("tokens_self_trained_vs_random", -0.01, -0.026, 0.006, 0.2),
        ]
    ]
    declared = {
        "emergence_within_loss": {"effect": 0.5, "source": "x"},
        "emergence_final_vs_init": {"effect": 0.05, "source": "x"},
        "tokens_self_trained_vs_random": {"effect": 0.05, "source": "x"},
    }
    table = inference.combine_analyses([inference.analysis_table(rows)], declared)
    pilot = pd.DataFrame(
        [dict(analysis=k, effect=v["effect"], power=0.9, alpha=0.0167) for k, v in declared.items()]
    )
    out = claims.claims_table(table, declared, pilot).set_index("claim")
    within = out.loc[claims.claim_of("emergence_within_loss")]
    assert within["verdict"].startswith(
        "inconclusive: the Holm-level interval [-0.306, 0.578] holds both 0 and the declared "
        "effect 0.5"
    ), within["verdict"]
    # tokens: -0.01 [-0.026, 0.006] excludes 0.05 even at Holm's level: one-sided p of
    # H0: effect >= 0.05 by hand, Holm over the three primaries' one-sided p
    se = {r["analysis"]: (r["ci_high"] - r["ci_low"]) / (2 * sps.t.ppf(0.975, 9)) for r in rows}
    one = {
        r["analysis"]: sps.t.cdf(
            (r["estimate"] - declared[r["analysis"]]["effect"]) / se[r["analysis"]], 9
        )
        for r in rows
    }
    adjusted = dict(zip(one, core.holm(list(one.values()))))
    tokens = out.loc[claims.claim_of("tokens_self_trained_vs_random")]
    assert tokens["p_effect"] == pytest.approx(one["tokens_self_trained_vs_random"])
    assert tokens["p_effect_holm"] == pytest.approx(adjusted["tokens_self_trained_vs_random"])
    half = sps.t.ppf(1 - 0.05 / 6, 9) * se["tokens_self_trained_vs_random"]
    assert tokens["holm_low"] == pytest.approx(-0.01 - half)
    assert tokens["verdict"].startswith(
        f"not reproduced at the declared size 0.05 (one-sided p = "
        f"{one['tokens_self_trained_vs_random']:.2g}, Holm p = "
        f"{adjusted['tokens_self_trained_vs_random']:.2g}; Holm-level interval ["
    ), tokens["verdict"]
    assert out.loc[claims.claim_of("emergence_final_vs_init"), "verdict"].startswith("reproduced (")


def test_claims_verdict_uses_the_decision_power_column():
    """A declared test with the power table's row: an inconclusive verdict says its power."""
    row = inference.analysis_row(
        "emergence_within_loss",
        "initialization (10 runs)",
        10,
        "t",
        0.1,
        -0.2,
        0.6,
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
    assert got["power"] == 0.9 and got["verdict"].endswith("(power 0.90)")


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
    assert _fixed_size_table(0.5)["verdict"].startswith("reproduced (Holm-level interval")
    disagree = _fixed_size_table(-0.5)["verdict"]
    assert disagree.startswith(
        "inconclusive: significant (Holm-level interval [0.4, 0.8]), but "
        "fixed_size_overlap_u_vs_bpb"
    )


def test_claims_print_the_runs_own_power_beside_the_pilots():
    """power_achieved: the pilot's simulation at the run's units, Holm's first threshold and
    every condition of the verdict (the overlap's sign agreement: its correlation with the
    score the run's overlap row); 0 for 6 units (the wild bootstrap's floor 2/64 > 0.05/m)."""
    row = _fixed_size_table(0.5)
    expected = decision_power(Design("slope", agree_r=0.5), 0.5, 20, 0.05, n_sim=100)
    assert row["power_achieved"] == expected
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
    first threshold, from the pilot's per-unit values (at the config's steps only), the arms
    test's from the change over the declared window."""
    rng = np.random.default_rng(4)
    steps = [0, 4, 16, 64, 256, 1000]
    within = pd.DataFrame(
        [
            dict(
                run=f"w{i}",
                step=s,
                data_fraction=1.0 if i < 3 else 0.01,
                val_loss=7 - np.log1p(s) / 3 + (i >= 3) * (s > 64) * 0.5,
                excess_k2=0.01 * np.log1p(s) + rng.normal(scale=0.01),
            )
            for i in range(6)
            for s in steps
        ]
    )
    across = pd.DataFrame(
        dict(
            excess_k2=rng.normal(size=8),
            twin_excess_k2=rng.normal(scale=0.01, size=8),
            overlap_k2=rng.normal(size=8),
            val_loss=rng.normal(size=8) + 5,
            tok_self_k2=rng.normal(0.3, 0.02, 8),
            twin_tok_self_k2=rng.normal(0.4, 0.02, 8),
        )
    )
    design_steps = [0, 4, 16, 64, 256]
    assert pilot_power.declared_window(within, design_steps) == [64, 256]
    tests = pilot_power.pilot_tests(within, across, 2, design_steps, 64, [64, 256])
    wide = within.pivot(index="run", columns="step", values="excess_k2")
    relax = wide[256] - wide[64]
    assert tests["emergence_relaxation"].estimate == pytest.approx(relax.mean())
    assert tests["emergence_relaxation"].design.sd == pytest.approx(relax.std(ddof=1))
    arms = tests["emergence_within_arms"]
    change = wide[256] - wide[64]
    assert arms.estimate == pytest.approx(change[:3].mean() - change[3:].mean())
    assert arms.n == 3 and arms.design.check[0] > 0  # the full arm's loss improves more
    twin = (across["excess_k2"] - across["twin_excess_k2"]).to_numpy()
    assert tests["fixed_size_trained_vs_random"].estimate == pytest.approx(twin.mean())
    declared = {
        "emergence_relaxation": {"effect": 0.05},
        "emergence_within_arms": {"effect": 0.01},
        "tokens_self_trained_vs_random": {"effect": 0.05},
        "fixed_size_excess_vs_bpb": {"effect": 0.5},
    }
    n = {
        "emergence_relaxation": 10,
        "emergence_within_arms": 5,
        "tokens_self_trained_vs_random": 20,
        "fixed_size_excess_vs_bpb": 20,
    }
    table = pilot_power.power_table(tests, declared, n, n_sim=40).set_index("analysis")
    assert set(table.index) == set(declared) and (table["alpha"] == 0.0125).all()
    assert table["power"].between(0, 1).all() and (table["pilot_n"] > 0).all()
    assert table.loc["tokens_self_trained_vs_random", "pilot_estimate"] == pytest.approx(
        (across["tok_self_k2"] - across["twin_tok_self_k2"]).mean()
    )


# every shipped config, as --configfile layers it
SHIPPED_CONFIGS = [
    ["config.yaml"],
    ["config.yaml", "config/across_runs.yaml"],
    ["config.yaml", "config/within_arms.yaml"],
    ["config/paper.yaml"],
]


def test_the_defaults_declarations_are_the_pilots_and_its_primaries_powered():
    """config.yaml's peak step and window are what its pilot (resources/pilot_within.csv,
    seeds disjoint from the run's) declares, never read from the run; relaxation is primary;
    and every primary of config.yaml and of each layered config has its power at its declared
    effect in its power file, at least 0.8."""
    from pathlib import Path

    from blockcoupling.cli.config_commands import layered
    from blockcoupling.cli.pilot import design_steps

    root = Path(__file__).resolve().parents[1]
    within = pd.read_csv(root / "resources/pilot_within.csv")
    for extra in ([], ["config/across_runs.yaml"], ["config/within_arms.yaml"]):
        config = layered([root / "config.yaml", *(root / e for e in extra)])
        stats, steps = config["stats"], design_steps(config)
        assert stats["peak_step"] == pilot_power.declared_peak_step(within, stats["k"], steps)
        assert stats["within_window"] == pilot_power.declared_window(within, steps)
        assert "emergence_relaxation" in stats["primary"]
        table = pd.read_csv(root / stats["power_file"]).set_index("analysis")
        assert list(table.index) == list(stats["primary"]), extra
        for name, entry in stats["primary"].items():
            assert table.loc[name, "effect"] == entry["effect"]
            assert table.loc[name, "power"] >= 0.8, (extra, name)
            assert table.loc[name, "alpha"] == pytest.approx(0.05 / len(stats["primary"]))


@pytest.mark.parametrize("files", SHIPPED_CONFIGS)
def test_every_shipped_configs_power_file_is_the_power_model_of_its_primaries(files, tmp_path):
    """Each shipped config's power file has one row per declared primary, in order, at its
    declared effect and Holm's first threshold over them, and its design's n; a config whose
    pilot cannot size it (config/paper.yaml: K = 10, hub models) has exactly the table that
    `blockcoupling pilot power` writes for it now (no power), never an earlier method's."""
    import argparse
    from pathlib import Path

    from blockcoupling.cli.config_commands import layered
    from blockcoupling.cli.pilot import KS, write_power
    from blockcoupling.pipeline.design_units import design_units

    root = Path(__file__).resolve().parents[1]
    paths = [root / f for f in files]
    stats = layered(paths)["stats"]
    table = pd.read_csv(root / stats["power_file"])
    assert list(table["analysis"]) == list(stats["primary"]), files
    units = design_units(layered(paths))
    for row in table.itertuples():
        assert row.effect == stats["primary"][row.analysis]["effect"]
        assert row.alpha == pytest.approx(0.05 / len(stats["primary"]))
        assert row.n == units[row.analysis], (files, row.analysis)
    if int(stats["k"]) not in KS:
        out = tmp_path / "power.csv"
        args = argparse.Namespace(configfile=paths, seed=0, out=out)
        write_power(args)
        pd.testing.assert_frame_equal(table, pd.read_csv(out))


@pytest.mark.parametrize("files", SHIPPED_CONFIGS)
def test_no_shipped_config_declares_a_primary_its_design_cannot_test(files):
    """config/paper.yaml declared three primaries its design had no units for (no fixed-size
    runs; two Pythia suites): their rows could only come out without an interval, p or verdict,
    after thousands of GPU-hours. Every shipped config's primaries have at least MIN_CLUSTERS
    units, and its plan carries each primary's count."""
    from pathlib import Path

    from blockcoupling.cli.config_commands import load_plan
    from blockcoupling.pipeline.design_units import primary_unit_warnings
    from blockcoupling.stats.inference import MIN_CLUSTERS

    root = Path(__file__).resolve().parents[1]
    plan = load_plan([root / f for f in files], root)
    assert set(plan.primary_units) == set(plan.primary)
    assert min(plan.primary_units.values()) >= MIN_CLUSTERS
    assert primary_unit_warnings(plan) == []


def test_a_primary_without_units_is_named_before_the_run(tmp_path):
    """A design with too few units for a declared primary gets one warning line naming the key,
    its units and the fix (check-config prints it; the workflow's main process prints it as a
    plan line). The units are the analyses': the trained suites' initializations where any
    exist, else one per hub repository measured at several steps (never for the within-loss
    test: no validation loss); a ViT OLS row needs its parameters plus two."""
    import dataclasses
    from pathlib import Path

    import yaml

    from blockcoupling.cli.config_commands import layered, load_plan
    from blockcoupling.pipeline.design_units import design_units, primary_unit_warnings

    root = Path(__file__).resolve().parents[1]
    suites = {
        f"pythia-{size}": {"source": {"hub": f"EleutherAI/pythia-{size}"}, "steps": [0, 1000]}
        for size in ("70m", "160m")
    }
    extra = tmp_path / "few.yaml"
    extra.write_text(yaml.safe_dump({"models": suites}))
    paths = [root / "config.yaml", extra]
    units = design_units(layered(paths))  # the trained suites only: the analyses read those
    assert units["emergence_final_vs_init"] == units["emergence_within_loss"] == 10
    assert units["emergence_within_arms"] == 5
    hub_only = tmp_path / "hub.yaml"
    hub_only.write_text(
        yaml.safe_dump(
            {
                "models": {**suites, "again": suites["pythia-70m"]},  # one repo: one init
                "stats": {"primary": {"emergence_final_vs_init": {"effect": 0.05, "source": "t"}}},
            }
        )
    )
    plan = load_plan([root / "config/paper.yaml", hub_only], root)
    assert plan.primary_units["emergence_final_vs_init"] == 2 + 2  # paper's two, two repos here
    assert (
        design_units(layered([root / "config/paper.yaml", hub_only]))["emergence_within_loss"] == 0
    )  # hub suites have no validation loss
    (line,) = primary_unit_warnings(plan)
    assert line.startswith("stats.primary.emergence_final_vs_init: this design gives it 4 unit")
    assert "fewer than the 5" in line and "move it out of stats.primary" in line
    few_vits = dataclasses.replace(
        plan,
        primary_units={"vit_sd_effect": 6},
        primary={"vit_sd_effect": {}, "emergence_trend": {}},
    )
    lines = primary_unit_warnings(few_vits)  # 64 ViTs need 2 + 7 + 2: 6 are too few
    assert lines[0].startswith("stats.primary.vit_sd_effect: this design gives it 6 unit")
    assert "fewer than the 11" in lines[0]
    assert lines[1].startswith("stats.primary.emergence_trend: its units are not counted")
