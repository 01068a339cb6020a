"""Rule stats_claims: every family's analysis rows in one table (Holm over the declared primary
tests), one row per paper claim with its verdict, and its markdown rendering."""

import pandas as pd

from blockcoupling.io import git_commit, write_text
from blockcoupling.runner import run_script
from blockcoupling.stats import claims, core, inference


def main(sm):
    frames = [pd.read_csv(path) for path in sm.input]
    analyses = inference.combine_analyses(frames, sm.params.primary)
    table = claims.claims_table(analyses, sm.params.primary)
    core.write_table(analyses, sm.output.analyses)
    core.write_table(table, sm.output.claims)
    write_text(sm.output.markdown, claims.claims_markdown(table, git_commit()))


run_script(snakemake, main)
