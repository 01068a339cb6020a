"""The fifth round of hostile inputs and faults (issue 42): a fetch that could delete outside its
folder, ``verify`` fooled by symlinks, planted files and deleted records, fetched weights
checked by content, values that passed the checks and failed late, the lock file, one-line
errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from blockcoupling import cli
from blockcoupling.files import manifest, run_record
from blockcoupling.lm import hub
from blockcoupling.lm.hub_names import HubNameError, check_fetch_folder
from blockcoupling.pipeline.slurm import minutes

MODEL = "tiny-org/neox"


def one_line_error(capsys: pytest.CaptureFixture, argv: list[str], code: int = 2) -> str:
    """The one stderr line of ``blockcoupling ARGV`` (exit status ``code``)."""
    assert cli.main(argv) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# --- a fetch deletes nothing outside its folder ----------------------------------------------


@pytest.fixture
def victim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Another model's folder in the hub cache of ``tmp_path`` (the working directory)."""
    monkeypatch.chdir(tmp_path)
    for name in hub.OFFLINE:  # the fetch command runs in this process, huggingface_hub imported
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "cache" / "models" / "tiny-org" / "victim"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


@pytest.mark.parametrize(
    ("repo", "revision", "folder"),
    [
        (MODEL, "..", f"cache/models/{MODEL}/.."),
        ("neox", "..", "cache/models/neox/.."),
        (MODEL, ".", f"cache/models/{MODEL}/."),
        ("tiny-org/..", "main", "cache/models/tiny-org/../main"),
    ],
)
def test_fetch_refuses_a_folder_that_leads_out_and_deletes_nothing(
    victim: Path, capsys: pytest.CaptureFixture, repo: str, revision: str, folder: str
) -> None:
    line = one_line_error(capsys, ["fetch", repo, revision, folder])
    assert line.startswith("blockcoupling fetch: hub ") and "is not a" in line  # id or revision
    assert (victim / "model.safetensors").read_bytes() == b"weights"
    with pytest.raises(HubNameError):  # the workflow's fetch rules go through the same check
        hub.fetch_model(repo, revision, folder)
    assert (victim / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize(
    ("repo", "link"), [(MODEL, f"cache/models/{MODEL}/main"), ("evil/neox", "cache/models/evil")]
)
def test_fetch_refuses_a_symlinked_folder_and_leaves_its_target(
    victim: Path, tmp_path: Path, capsys: pytest.CaptureFixture, repo: str, link: str
) -> None:
    outside = tmp_path / "outside"
    (outside / "neox" / "main").mkdir(parents=True)
    (outside / "neox" / "main" / "keep").write_text("mine")
    (outside / "keep").write_text("mine")
    Path(link).parent.mkdir(parents=True, exist_ok=True)
    Path(link).symlink_to(outside)
    line = one_line_error(capsys, ["fetch", repo, "main", f"cache/models/{repo}/main"])
    assert "is a symlink" in line and "remove the link" in line
    with pytest.raises(HubNameError, match="is a symlink"):
        hub.fetch_model(repo, "main", f"cache/models/{repo}/main")
    assert (outside / "keep").read_text() == (outside / "neox" / "main" / "keep").read_text()


def test_a_symlinked_cache_dir_is_fine(tmp_path: Path) -> None:
    """The cache itself may live elsewhere (hub_cache -> /scratch/...): only the parts below it
    must be plain folders."""
    (tmp_path / "scratch").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "scratch")
    folder = tmp_path / "cache" / "models" / MODEL / "main"
    cache, kind, resolved = check_fetch_folder(folder, MODEL, "main")
    assert (cache, kind) == (tmp_path / "cache", "model")
    assert resolved == tmp_path / "scratch" / "models" / MODEL / "main"


# --- verify over the whole run ---------------------------------------------------------------


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A results folder as jobs leave it: two CSV tables, a directory output, a trainer's work
    folder; every result recorded."""
    root = tmp_path / "results"
    for name in ("stats/a.csv", "stats/b.csv", "models/m/converted/config.json"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x,y\n1,2\n" if name.endswith(".csv") else "{}")
    manifest.record([root / "stats" / "a.csv", root / "stats" / "b.csv"])
    manifest.record([root / "models" / "m" / "converted"])
    work = root / "train" / "r" / "work-0123456789ab"
    work.mkdir(parents=True)
    (work / "state.pt").write_bytes(b"resume state")
    assert manifest.verify(root) == []
    return root


def test_verify_names_a_recorded_folder_replaced_by_a_symlink_to_a_modified_copy(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(run / "stats", copy)
    (copy / "a.csv").write_text("x,y\n1,3\n")
    shutil.rmtree(run / "stats")
    (run / "stats").symlink_to(copy)
    assert manifest.verify(run) == [
        f"{run / 'stats'}: a symlink (to {copy}), not a result its job wrote; delete the link and "
        "rerun the workflow"
    ]
    assert cli.main(["verify", str(run)]) == 1
    assert "a symlink" in capsys.readouterr().out


def test_verify_names_a_planted_symlink_and_planted_files(run: Path) -> None:
    (run / "figures").mkdir()
    (run / "figures" / "etc").symlink_to("/etc")
    (run / "stats" / "work-evil").mkdir()
    (run / "stats" / "work-evil" / "x.csv").write_text("x\n1\n")
    (run / "stats" / ".manifest").mkdir()
    (run / "stats" / ".manifest" / "y.json").write_text("{}")
    problems = manifest.verify(run)
    assert problems == [
        f"{run / 'figures' / 'etc'}: a symlink (to /etc), not a result its job wrote; delete the "
        "link and rerun the workflow",
        f"{run / 'stats' / '.manifest' / 'y.json'}: no record in .manifest (not written by a "
        "workflow job)",
        f"{run / 'stats' / 'work-evil' / 'x.csv'}: no record in .manifest (not written by a "
        "workflow job)",
    ]


def test_verify_sees_a_file_deleted_together_with_its_record(run: Path) -> None:
    (run / "stats" / "b.csv").unlink()
    (run / ".manifest" / "stats" / "b.csv.json").unlink()
    assert manifest.verify(run) == [
        f"{run / 'stats' / 'b.csv'}: in the run record, but the file and its record are gone "
        "(deleted together); rerun the workflow"
    ]


def test_verify_sees_a_file_planted_with_a_record_by_hand(run: Path) -> None:
    planted = run / "stats" / "c.csv"
    planted.write_text("x\n1\n")
    entry = {"sha256": manifest.sha256(planted), "size": planted.stat().st_size}
    (run / ".manifest" / "stats" / "c.csv.json").write_text(json.dumps(entry))
    [line] = manifest.verify(run)
    assert line.startswith(f"{planted}: has a record but is not in the run record")


@pytest.mark.parametrize("text", ["garbage", '{"sha256": "00"}', "[]"])
def test_verify_names_an_unreadable_record_in_one_line(
    run: Path, capsys: pytest.CaptureFixture, text: str
) -> None:
    record = run / ".manifest" / "stats" / "a.csv.json"
    record.write_text(text)
    assert manifest.verify(run) == [
        f"{record}: not a record of {run / 'stats' / 'a.csv'} (no JSON with its sha256 and size); "
        "delete both and rerun the workflow"
    ]
    assert cli.main(["verify", str(run)]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("text", ["garbage", '{"files": {}, "sha256": "0"}', ""])
def test_verify_names_a_run_record_that_does_not_read_or_was_edited(run: Path, text: str) -> None:
    where = run / ".manifest" / ".run"
    where.write_text(text)
    [line] = manifest.verify(run)
    assert line.startswith(f"{where}: ") and "cannot be trusted" in line
    where.unlink()
    [line] = manifest.verify(run)
    assert line.startswith(f"{where}: no run record")


def test_a_results_folder_from_before_the_run_record_is_adopted_by_its_next_job(run: Path) -> None:
    (run / ".manifest" / ".run").unlink()
    (run / "stats" / "d.csv").write_text("x\n1\n")
    manifest.record([run / "stats" / "d.csv"])
    assert manifest.verify(run) == []
    listed = run_record.read(run / ".manifest" / ".run")
    assert listed is not None and sorted(listed) == [
        "models/m/converted/config.json",
        "stats/a.csv",
        "stats/b.csv",
        "stats/d.csv",
    ]


def test_a_directory_output_written_anew_replaces_its_run_record_entries(run: Path) -> None:
    folder = run / "models" / "m" / "converted"
    (folder / "config.json").unlink()
    (folder / "model.json").write_text("{}")
    manifest.record([folder])
    assert manifest.verify(run) == []


# --- planner inputs ------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["-5", "-1-00:00:00", "0", "0:00", "1:-5", "5m", "1-"])
def test_plan_refuses_a_time_limit_that_is_not_positive_naming_the_flag(
    capsys: pytest.CaptureFixture, limit: str
) -> None:
    line = one_line_error(capsys, ["plan", "--configfile", "any.yaml", f"--time-limit={limit}"])
    assert line.startswith(f"blockcoupling plan: --time-limit {limit!r}: time limit")
    assert "give a positive limit" in line
    with pytest.raises(ValueError, match="time limit"):
        minutes(limit)


@pytest.mark.parametrize(
    ("limit", "value"), [("5", 5), ("1:30:00", 90), ("1-00:00:00", 1440), ("infinite", None)]
)
def test_valid_time_limits_still_read(limit: str, value: int | None) -> None:
    assert minutes(limit) == value


def test_plan_csv_that_is_a_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    line = one_line_error(capsys, ["plan", "--configfile", "any.yaml", "--csv", str(tmp_path)])
    assert line == (
        f"blockcoupling plan: --csv {tmp_path}: is a folder; name a CSV file, e.g. --csv plan.csv"
    )
