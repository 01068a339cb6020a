"""The ids of every test the analysis tables report (config ``stats.primary`` declares some of
them, with their effects); no heavy imports, so the workflow checks the config without
loading statsmodels.
"""

from __future__ import annotations

import itertools

from blockcoupling.coupling import registry as measures


def _ids() -> tuple[str, ...]:
    """Every analysis id (per-run rows ``<id>:<model>`` are exploratory and not listed)."""
    fixed = [
        f"fixed_size_{p}_vs_{o}{s}{c}"
        for p, o, s, c in itertools.product(
            tuple(m.key for m in measures.tested()),
            ("bpb", "gap"),
            ("", "_leaderboard"),
            ("", "_config_spearman", "_adjusted", "_rank_adjusted"),
        )
    ]
    emergence = [
        f"emergence_{t}{s}"
        for t, s in itertools.product(
            ("trend", "loss_slope", "peak_vs_init", "peak_vs_final", "final_vs_init", "relaxation"),
            ("", "_coupling"),
        )
    ]
    emergence += ["emergence_locality", "emergence_within_loss"]
    emergence += ["emergence_within_arms", "emergence_within_arms_val_loss"]
    emergence += [f"emergence_{m}_final_vs_init" for m in ("lss", "expodistance")]
    suffixes = [measures.test_suffix(m) for m in measures.primary_first()]
    vit = [f"vit_sd_effect{s}" for s in (*suffixes, "_accuracy")]
    vit += [f"vit_accuracy_within_rate{s}" for s in suffixes]
    extra = (
        "fixed_size_trained_vs_random",
        "crossmodel_coupling_vs_score",
        "crossmodel_coupling_vs_size",
        "tokens_self_trained_vs_random",
        "tokens_context_trained_vs_random",
    )
    return (*fixed, *emergence, *vit, *extra)


HYPOTHESES = _ids()
