"""The ids of every test the analysis tables report (config ``stats.primary`` names some of
them); no heavy imports, so the workflow checks the config without loading statsmodels.
"""

from __future__ import annotations

import itertools

DEFAULT_PRIMARY = (
    "fixed_size_excess_vs_bpb",
    "emergence_trend",
    "vit_sd_effect",
    "vit_accuracy_within_rate",
)


def _ids() -> tuple[str, ...]:
    """Every analysis id (per-run rows ``<id>:<model>`` are exploratory and not listed)."""
    fixed = [
        f"fixed_size_{p}_vs_{o}{s}{c}"
        for p, o, s, c in itertools.product(
            ("excess", "overlap_u", "coupling"),
            ("bpb", "gap"),
            ("", "_leaderboard"),
            ("", "_config_spearman"),
        )
    ]
    emergence = [
        f"emergence_{t}{s}"
        for t, s in itertools.product(
            ("trend", "loss_slope", "peak_vs_init", "peak_vs_final"), ("", "_coupling")
        )
    ]
    vit = [f"vit_sd_effect{s}" for s in ("", "_coupling", "_overlap_u", "_accuracy")]
    vit += [f"vit_accuracy_within_rate{s}" for s in ("", "_coupling", "_overlap_u")]
    extra = ("fixed_size_trained_vs_random", "crossmodel_coupling_vs_score")
    return (*fixed, *emergence, *vit, *extra)


HYPOTHESES = _ids()
