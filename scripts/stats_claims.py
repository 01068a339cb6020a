"""Rule stats_claims: every family's analysis rows in one table (Holm over the declared primary
tests), one row per paper claim with its verdict, and its markdown rendering (with the raw
coupling of each model beside its chance level and excess)."""

import pandas as pd

from blockcoupling.io import git_commit, write_text
from blockcoupling.runner import run_script
from blockcoupling.stats import calibration, claims, core, inference


def main(sm):
    frames = [pd.read_csv(path) for path in sm.input.tables]
    analyses = inference.combine_analyses(frames, sm.params.primary)
    table = claims.claims_table(analyses, sm.params.primary)
    core.write_table(analyses, sm.output.analyses)
    core.write_table(table, sm.output.claims)
    markdown = claims.claims_markdown(table, git_commit())
    if sm.input.calibration:
        frame = pd.read_csv(sm.input.calibration[0])
        markdown += "\n" + calibration.calibration_markdown(frame, sm.params.grids)
    write_text(sm.output.markdown, markdown)


run_script(snakemake, main)
