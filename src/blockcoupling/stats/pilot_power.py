"""Power of the declared primary tests from pilot runs (``blockcoupling pilot``): per-unit
pilot values of each primary, the spread they give the simulation of the verdict's rule
(``decision_power``), the power at the design's n, and what the pilot declares before the run
(the peak step of ``emergence_relaxation``, the window of ``emergence_within_arms``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from blockcoupling.stats import power as pw
from blockcoupling.stats.checkpoints import within_loss_z
from blockcoupling.stats.decision_power import DECISION_SIM, Design, decision_power


@dataclass(frozen=True)
class PilotTest:
    """One primary's pilot: its simulation ``design`` (with the pilot's sd), the pilot's
    ``estimate`` and standard error ``se``, and its units ``n`` (per arm for ``arms``).
    """

    design: Design
    estimate: float
    se: float
    n: int


def declared_peak_step(within: pd.DataFrame, k: int, steps: list[int]) -> int:
    """The step (of the design's ``steps``) where the pilot suites' mean excess at K = ``k``
    is highest: the peak ``emergence_relaxation`` tests the last step against.
    """
    rows = within[within["step"].isin(steps)]
    return int(rows.groupby("step")[f"excess_k{k}"].mean().idxmax())


def declared_window(within: pd.DataFrame, steps: list[int]) -> list[int]:
    """The window of ``emergence_within_arms``: from the step (of ``steps``) where the small
    data fraction's mean validation loss is lowest (where the arms start to part in
    generalization) to the last of ``steps``.
    """
    rows = within[within["step"].isin(steps)]
    small = rows[rows["data_fraction"] < rows["data_fraction"].max()]
    return [int(small.groupby("step")["val_loss"].mean().idxmin()), int(max(steps))]


def _changes(within: pd.DataFrame, column: str, window: list[int]) -> pd.DataFrame:
    """Per suite: its arm (1 at the largest data fraction, else 0) and ``column`` at the
    window's end minus at its start.
    """
    start, end = window
    rows = within.set_index(["run", "step"])[column].unstack("step")
    arm = within.groupby("run")["data_fraction"].first()
    return pd.DataFrame(
        {"change": rows[end] - rows[start], "arm": (arm == arm.max()).astype(float)}
    ).dropna()


def _arms(frame: pd.DataFrame) -> tuple[float, float, int]:
    """(difference of the arms' means, pooled within-arm sd, units of the smaller arm)."""
    one, zero = frame[frame["arm"] == 1]["change"], frame[frame["arm"] == 0]["change"]
    dof = len(one) + len(zero) - 2
    pooled = ((len(one) - 1) * one.var() + (len(zero) - 1) * zero.var()) / max(dof, 1)
    return float(one.mean() - zero.mean()), float(np.sqrt(pooled)), min(len(one), len(zero))


def _mean_test(values: np.ndarray) -> PilotTest:
    """A one-sample test's pilot: normal draws at the units' sd."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    sd = float(values.std(ddof=1)) if values.size > 1 else np.nan
    return PilotTest(
        Design("mean", sd), float(values.mean()), sd / np.sqrt(values.size), values.size
    )


def pilot_tests(
    within: pd.DataFrame,
    across: pd.DataFrame,
    k: int,
    steps: list[int],
    peak_step: int | None = None,
    window: list[int] | None = None,
) -> dict[str, PilotTest]:
    """Each primary's pilot (``PilotTest``) from the two pilot tables at K = ``k`` and the
    design's checkpoint ``steps``: within-run Fisher z, last - first and last - ``peak_step``
    excess per suite, trained - twin excess per run, the arms' difference in the excess's
    change over ``window`` (its manipulation check: the same for minus validation loss),
    trained - twin token self excess per run, and the across-runs slope of minus validation
    loss on the excess (its agreement condition: the overlap's correlation with it).
    """
    col = f"excess_k{k}"
    suites = within[within["step"].isin(steps)].assign(neg_val_loss=lambda f: -f["val_loss"])
    z, growth, relax = [], [], []
    for _, rows in suites.groupby("run"):
        rows = rows.sort_values("step")
        z.append(within_loss_z(rows.rename(columns={col: "coupling_excess"})))
        growth.append(float(rows[col].iloc[-1] - rows[col].iloc[0]))
        at_peak = rows.loc[rows["step"] == peak_step, col]
        relax.append(float(rows[col].iloc[-1] - at_peak.iloc[0]) if len(at_peak) else np.nan)
    tests = {
        "emergence_within_loss": _mean_test(np.array(z)),
        "emergence_final_vs_init": _mean_test(np.array(growth)),
        "fixed_size_trained_vs_random": _mean_test(
            (across[col] - across[f"twin_{col}"]).to_numpy()
        ),
        "tokens_self_trained_vs_random": _mean_test(
            (across[f"tok_self_k{k}"] - across[f"twin_tok_self_k{k}"]).to_numpy()
        ),
    }
    if peak_step is not None:
        tests["emergence_relaxation"] = _mean_test(np.array(relax))
    if window is not None:
        diff, sd, n = _arms(_changes(suites, col, window))
        check_diff, check_sd, _ = _arms(_changes(suites, "neg_val_loss", window))
        tests["emergence_within_arms"] = PilotTest(
            Design("arms", sd, check=(check_diff, check_sd)), diff, sd * np.sqrt(2 / n), n
        )
    x, y = across[col].to_numpy(), -across["val_loss"].to_numpy()
    keep = np.isfinite(x) & np.isfinite(y)
    r = float(np.corrcoef(x[keep], y[keep])[0, 1])
    agree = float(np.corrcoef(across[f"overlap_k{k}"].to_numpy()[keep], y[keep])[0, 1])
    tests["fixed_size_excess_vs_bpb"] = PilotTest(
        Design("slope", agree_r=agree),
        r,
        np.sqrt((1 - r**2) / max(keep.sum() - 2, 1)),
        int(keep.sum()),
    )
    return tests


def power_table(
    tests: dict[str, PilotTest],
    primary: dict[str, dict],
    design_n: dict[str, int],
    seed: int = 0,
    n_sim: int | None = None,
) -> pd.DataFrame:
    """``stats.power.POWER_COLUMNS`` rows: each declared primary's power under the verdict's
    rule (``decision_power``, normal draws at its pilot's sd) at the design's n (per arm for
    an arms design) and Holm's first threshold, with the n that reaches 80% (NaN: beyond 4 n).
    """
    alpha = pw.holm_first_alpha(len(primary))
    sims = n_sim or DECISION_SIM
    rows = []
    for analysis, declared in primary.items():
        effect, n = float(declared["effect"]), int(design_n[analysis])
        pilot = tests.get(analysis)
        if pilot is None:
            rows.append(dict(analysis=analysis, effect=effect, n=n, alpha=alpha))
            continue

        def at(m: int, pilot: PilotTest = pilot, effect: float = effect) -> float:
            return decision_power(pilot.design, effect, m, alpha, sims, seed)

        power = at(n)
        need = n if power >= pw.TARGET else pw.n_for_power(at, n + 1, 4 * n)
        arms = 2 if pilot.design.kind == "arms" else 1
        rows.append(
            dict(
                analysis=analysis,
                effect=effect,
                pilot_estimate=pilot.estimate,
                pilot_se=pilot.se,
                pilot_n=pilot.n,
                pilot_df=arms * pilot.n - 1,
                n=n,
                df=arms * n - 1,
                alpha=alpha,
                power=power,
                n_for_target=need,
            )
        )
    return pd.DataFrame(rows, columns=list(pw.POWER_COLUMNS))
