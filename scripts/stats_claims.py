"""Rule stats_claims: every family's analysis rows in one table (Holm over the declared primary
tests), one row per paper claim with its verdict, declared effect and pilot power, and its
markdown rendering (with the raw coupling of each model beside its chance level and excess)."""

import pandas as pd

from blockcoupling.files.io import git_commit, write_text
from blockcoupling.runtime.runner import run_script
from blockcoupling.stats import calibration, claims, core, inference


def main(sm):
    frames = [pd.read_csv(path) for path in sm.input.tables]
    analyses = inference.combine_analyses(frames, sm.params.primary)
    power = pd.read_csv(sm.input.power)
    frame = pd.read_csv(sm.input.calibration[0]) if sm.input.calibration else None
    suites = pd.read_csv(sm.input.checkpoints[0]) if sm.input.checkpoints else None
    flags, warnings = calibration.rank_flags(frame, suites, sm.params.k)
    table = claims.claims_table(analyses, sm.params.primary, power, flags)
    core.write_table(analyses, sm.output.analyses)
    core.write_table(table, sm.output.claims)
    markdown = claims.claims_markdown(table, git_commit())
    if frame is not None:
        markdown += "\n" + calibration.calibration_markdown(frame, sm.params.grids)
    markdown += "".join(f"\n- {name}: {text}" for name, text in warnings.items())
    markdown += "\n" if warnings else ""
    write_text(sm.output.markdown, markdown)


run_script(snakemake, main)
