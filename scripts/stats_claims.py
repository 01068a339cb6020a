"""Rule stats_claims: every family's analysis rows in one table (Holm over the declared primary
tests), one row per paper claim with its verdict, declared effect and pilot power, and its
markdown rendering (with the raw coupling of each model beside its chance level and excess)."""

import pandas as pd

from blockcoupling.files.io import git_commit, write_text
from blockcoupling.runtime.runner import run_script
from blockcoupling.stats import calibration, claims, core, inference


def main(sm):
    frames = [pd.read_csv(path) for path in sm.input.tables]
    analyses = inference.combine_analyses(frames, list(sm.params.primary))
    power = pd.read_csv(sm.input.power)
    flags = {}
    if sm.input.calibration:
        frame = pd.read_csv(sm.input.calibration[0])
        warnings = calibration.rank_warnings(frame, sm.params.k)
        for claim in claims.CLAIMS:
            family = claim.analysis.split("_")[0]
            label = "fixed_size" if family in ("fixed", "tokens") else None
            if label in warnings:
                flags[claim.analysis] = warnings[label]
    table = claims.claims_table(analyses, sm.params.primary, power, flags)
    core.write_table(analyses, sm.output.analyses)
    core.write_table(table, sm.output.claims)
    markdown = claims.claims_markdown(table, git_commit())
    if sm.input.calibration:
        markdown += "\n" + calibration.calibration_markdown(frame, sm.params.grids)
        markdown += "".join(f"\n- {name}: {text}" for name, text in warnings.items())
        markdown += "\n" if warnings else ""
    write_text(sm.output.markdown, markdown)


run_script(snakemake, main)
