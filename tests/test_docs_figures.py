"""The documentation's figures come from a run of the current design: every figure the workflow
draws carries a provenance stamp (commit, config hash, figure code hash) in its PNG, ``blockcoupling
docs --figures RUN`` copies the docs' figures from a run, and a committed docs figure whose stamp
is older than the config or the code that makes it fails here (docs/figures/coupling_vs_step.png,
the README's first figure, once showed a design the run no longer made)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import yaml
from conftest import REPO

from blockcoupling.cli import main
from blockcoupling.pipeline import docs_figures, figure_stamp
from blockcoupling.pipeline.docs_figures import CONFIG, DESIGN, DOCS_FIGURES


def run_folder(tmp_path: Path, config: str, design: str, stamped: bool = True) -> Path:
    """A finished run's figure folder: each docs figure a small PNG, stamped as its job does
    (``config``: the config's hash)."""
    figures = tmp_path / "run" / "results" / "figures"
    figures.mkdir(parents=True)
    for name in DOCS_FIGURES:
        fig, ax = plt.subplots(figsize=(1, 1))
        ax.plot([0, 1], [0, 1])
        fig.savefig(figures / f"{name}.png", dpi=50)
        plt.close(fig)
        if stamped:
            figure_stamp.stamp_png(figures / f"{name}.png", config, design)
    return tmp_path / "run"


def test_a_stamped_figure_is_current_until_its_config_or_design_changes(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run = run_folder(tmp_path, docs_figures.file_config_hash(path), docs_figures.design_hash())
    out = tmp_path / "docs" / "figures"
    assert main(["docs", "--figures", str(run), "--out", str(out)]) == 0
    assert (
        docs_figures.read_stamp(out / "coupling_vs_step.png")[DESIGN] == docs_figures.design_hash()
    )
    assert docs_figures.stale(out, path) == []
    path.write_text(yaml.safe_dump(config | {"stats": config["stats"] | {"k": 3}}))
    problems = docs_figures.stale(out, path)
    assert len(problems) == len(DOCS_FIGURES) and all(CONFIG in p for p in problems), problems
    path.write_text(yaml.safe_dump(config))
    old = run_folder(tmp_path / "old", docs_figures.file_config_hash(path), "0123456789ab")
    main(["docs", "--figures", str(old), "--out", str(out)])
    problems = docs_figures.stale(out, path)
    assert problems and all(f"{DESIGN} 0123456789ab" in p for p in problems), problems


def test_an_unstamped_run_figure_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = run_folder(tmp_path, "x", "x", stamped=False)
    assert main(["docs", "--figures", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "has no provenance stamp" in err, err
    assert not (tmp_path / "out").exists()


def test_the_committed_docs_figures_are_from_the_current_design() -> None:
    """docs/figures (the README's and the site's figures) from a default run of this code and
    config.yaml: regenerate with the default run and `blockcoupling docs --figures RUN`."""
    problems = docs_figures.stale(REPO / "docs" / "figures", REPO / "config.yaml")
    assert not problems, "\n".join(problems)
