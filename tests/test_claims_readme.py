"""`blockcoupling claims --readme`: markers twice and a read-only README are refused and left alone;
a symlinked README and the file's mode are kept."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from blockcoupling import cli

pytestmark = pytest.mark.usefixtures("root_logging")  # rule scripts run in-process


# --- claims --readme ---------------------------------------------------------------------


@pytest.fixture
def claims_run(tmp_path: Path) -> Path:
    (tmp_path / "results" / "stats").mkdir(parents=True)
    (tmp_path / "results" / "stats" / "claims.md").write_text("| new table |\n")
    return tmp_path / "results"


def _readme(text: str) -> str:
    from blockcoupling.stats import claims

    return text.format(start=claims.START, end=claims.END)


def test_claims_refuses_markers_twice(
    claims_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    readme = tmp_path / "README.md"
    text = _readme("{start}\nA\n{end}\nmiddle\n{start}\nB\n{end}\n")
    readme.write_text(text)
    assert cli.main(["claims", str(claims_run), "--readme", str(readme)]) == 2
    assert "2 <!-- claims:start -->" in capsys.readouterr().err
    assert readme.read_text() == text


def test_claims_refuses_a_read_only_readme_and_leaves_it_alone(
    claims_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    readme = tmp_path / "README.md"
    text = _readme("top\n{start}\nold\n{end}\n")
    readme.write_text(text)
    readme.chmod(0o444)
    assert cli.main(["claims", str(claims_run), "--readme", str(readme)]) == 2
    assert "read-only" in capsys.readouterr().err
    assert readme.read_text() == text and (readme.stat().st_mode & 0o777) == 0o444


def test_claims_keeps_a_readme_symlink_and_the_files_mode(claims_run: Path, tmp_path: Path) -> None:
    real = tmp_path / "docs" / "README.md"
    real.parent.mkdir()
    real.write_text(_readme("top\n{start}\nold\n{end}\n"))
    real.chmod(0o640)
    link = tmp_path / "README.md"
    link.symlink_to(real)
    assert cli.main(["claims", str(claims_run), "--readme", str(link)]) == 0
    assert link.is_symlink() and "| new table |" in real.read_text()
    assert (real.stat().st_mode & 0o777) == 0o640


def test_the_readme_gets_the_tables_and_a_link_not_the_sentences(tmp_path: Path) -> None:
    """The sentences that read each row stay in the run's claims.md; the README keeps its
    tables and one line naming where the sentences are and linking the page on the columns."""
    from blockcoupling.stats.claims_markdown import claims_prose

    results = tmp_path / "results"
    (results / "stats").mkdir(parents=True)
    rows = pd.DataFrame(
        {"claim": ["A", "B"], "primary": [True, False], "verdict": ["x", "y"]}
        | {"estimate": [float("nan")] * 2}
    )
    prose = claims_prose(rows)
    body = "| table |\n\n" + prose + "\nRaw coupling beside its chance level.\n\n| raw |\n"
    (results / "stats" / "claims.md").write_text(body)
    readme = tmp_path / "README.md"
    readme.write_text(_readme("top\n{start}\nold\n{end}\nend\n"))
    assert cli.main(["claims", str(results), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "| table |" in text and "| raw |" in text and "Raw coupling beside" in text
    assert "- A (primary)" not in text and "How to read it" not in text
    assert "(2 rows)" in text and "docs/statistics.md#the-claims-table" in text
    assert (results / "stats" / "claims.md").read_text() == body  # the run's file keeps them
