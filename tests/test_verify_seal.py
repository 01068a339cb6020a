"""``verify`` against a hostile user who can rewrite a results folder but not the seal key: a
consistent forgery (a file edited together with its record and its run-record entry, resealed as
an unkeyed list would be), a deletion resealed so, a run record deleted and restarted by the
next job, the trainers' work folders as blind spots, strays in the manifest folder, FIFOs
(never opened) and a lock file planted as a symlink."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blockcoupling.files import manifest, run_record


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A results folder as jobs leave it: two tables, a trainer's run (a checkpoint and its work
    folder), every result recorded; clean."""
    root = tmp_path / "results"
    for name in ("stats/a.csv", "stats/b.csv", "train/r/step4/config.json"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x,y\n1,2\n" if name.endswith(".csv") else "{}")
    manifest.record([root / "stats" / "a.csv", root / "stats" / "b.csv"])
    manifest.record([root / "train" / "r" / "step4"])
    work = root / "train" / "r" / "work-0123456789ab"
    work.mkdir(parents=True)
    (work / "state.pt").write_bytes(b"resume state")
    assert manifest.verify(root) == []
    return root


def forge_entry(root: Path, relative: str, text: str | None) -> None:
    """Rewrite (``text``) or delete (None) ``relative`` together with its record and its entry
    in the run record, resealed the way an unkeyed seal is computed (SHA-256 over the sorted
    list), as someone without the key would."""
    path, entry_path = root / relative, root / ".manifest" / f"{relative}.json"
    listed = json.loads((root / ".manifest" / ".run").read_text())["files"]
    if text is None:
        path.unlink()
        entry_path.unlink()
        del listed[relative]
    else:
        path.write_text(text)
        digest = manifest.sha256(path)
        entry = {"sha256": digest, "size": path.stat().st_size, "rule": "stats"}
        entry_path.write_text(json.dumps(entry))
        listed[relative] = digest
    lines = "".join(f"{digest}  {name}\n" for name, digest in sorted(listed.items()))
    seal = hashlib.sha256(lines.encode()).hexdigest()
    (root / ".manifest" / ".run").write_text(json.dumps({"files": listed, "sha256": seal}))


@pytest.mark.parametrize("text", ["x,y\n1,3\n", None], ids=["edited", "deleted"])
def test_a_consistent_forgery_resealed_without_the_key_is_named(run: Path, text: str) -> None:
    forge_entry(run, "stats/b.csv", text)
    [line] = manifest.verify(run)
    assert line.startswith(f"{run / '.manifest' / '.run'}: not a run record")
    assert "cannot be trusted" in line


def test_a_forgery_sealed_with_another_key_is_named(run: Path, tmp_path: Path) -> None:
    """A forger's own key gives a seal that holds under it, and names the key it is not."""
    from blockcoupling.files import seal_key

    forger = bytes(range(32))
    where = run / ".manifest" / ".run"
    listed = json.loads(where.read_text())["files"]
    (run / "stats" / "b.csv").write_text("x,y\n1,3\n")
    manifest.record([run / "stats" / "b.csv"])  # its record (and our run record) anew
    listed["stats/b.csv"] = manifest.sha256(run / "stats" / "b.csv")
    record = {
        "files": listed,
        "started": "",
        "key_id": seal_key.key_id(forger),
        "hmac_sha256": run_record.seal(listed, "", forger),
    }
    where.write_text(json.dumps(record))
    [line] = manifest.verify(run)
    assert line.startswith(f"{where}: sealed with another key ({seal_key.key_id(forger)})")


def test_without_the_key_verify_says_the_seal_cannot_be_checked(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blockcoupling.files import seal_key

    monkeypatch.setenv(seal_key.ENV, str(tmp_path / "absent.key"))
    [line] = manifest.verify(run)
    assert line.startswith(f"{run / '.manifest' / '.run'}: its seal cannot be checked")
    assert str(tmp_path / "absent.key") in line and seal_key.ENV in line
    assert not (tmp_path / "absent.key").exists()  # verify never creates a key


def test_the_key_is_created_once_private_and_outside_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blockcoupling.files import seal_key

    monkeypatch.delenv(seal_key.ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    where = tmp_path / "config" / "blockcoupling" / "seal.key"
    assert seal_key.location() == where and seal_key.load() is None
    key = seal_key.load(create=True)
    assert key is not None and len(key) == seal_key.SIZE
    assert seal_key.load(create=True) == key == seal_key.load()
    assert oct(where.stat().st_mode & 0o777) == "0o600"
    assert oct(where.parent.stat().st_mode & 0o777) == "0o700"


def test_a_run_record_deleted_then_restarted_by_the_next_job_is_named(run: Path) -> None:
    """Deleting b.csv, its record and the run record: the next job starts a run record from the
    per-file records, which says so; verify names it."""
    from blockcoupling.files import seal_key

    (run / "stats" / "b.csv").unlink()
    (run / ".manifest" / "stats" / "b.csv.json").unlink()
    (run / ".manifest" / ".run").unlink()
    (run / "stats" / "c.csv").write_text("x\n1\n")
    manifest.record([run / "stats" / "c.csv"])
    [line] = manifest.verify(run)
    assert line.startswith(f"{run / '.manifest' / '.run'}: started anew from the per-file records")
    listed = run_record.read(run / ".manifest" / ".run", seal_key.load())
    assert listed is not None and listed.checked and "stats/c.csv" in listed.files


def test_a_folders_first_job_starts_a_clean_run_record(tmp_path: Path) -> None:
    root = tmp_path / "results"
    (root / "a.csv").parent.mkdir(parents=True)
    (root / "a.csv").write_text("x\n1\n")
    manifest.record([root / "a.csv"])
    assert manifest.verify(root) == []


@pytest.mark.parametrize(
    "planted",
    [
        "train/r/x/work-0123456789ab/planted.csv",  # a folder deeper than a run's
        "vit/train/x/work-0123456789ab/planted.csv",  # not a ViT run's folder
        "train/other/work-0123456789ab/planted.csv",  # a run with no recorded results
    ],
)
def test_files_in_folders_named_like_work_folders_are_checked(run: Path, planted: str) -> None:
    (run / planted).parent.mkdir(parents=True)
    (run / planted).write_text("x\n1\n")
    assert manifest.verify(run) == [
        f"{run / planted}: no record in .manifest (not written by a workflow job)"
    ]


@pytest.mark.parametrize("name", ["notes.txt", "stats/a.csv.bak", ".run.orig"])
def test_every_entry_of_the_manifest_folder_is_accounted_for(run: Path, name: str) -> None:
    (run / ".manifest" / name).write_text("anything")
    assert manifest.verify(run) == [
        f"{run / '.manifest' / name}: in .manifest but not a record of a result (nor the run "
        "record); delete it and rerun the workflow"
    ]


def verify_in_a_process(root: Path) -> subprocess.CompletedProcess:
    """``blockcoupling verify ROOT`` in its own process, which a FIFO opened for reading would
    block (the test then fails by its timeout, not by hanging)."""
    command = [sys.executable, "-m", "blockcoupling.cli", "verify", str(root)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_fifo_with_a_record_is_named_without_being_opened(run: Path) -> None:
    fifo = run / "stats" / "p.csv"
    os.mkfifo(fifo)
    record = run / ".manifest" / "stats" / "p.csv.json"
    record.write_text(json.dumps({"sha256": "0" * 64, "size": 0, "rule": "stats"}))
    done = verify_in_a_process(run)
    assert done.returncode == 1
    assert f"{fifo}: not a regular file (a FIFO, socket or device; not opened)" in done.stdout


def test_a_fifo_in_place_of_a_record_or_the_run_record_is_not_opened(run: Path) -> None:
    record = run / ".manifest" / "stats" / "a.csv.json"
    record.unlink()
    os.mkfifo(record)
    (run / ".manifest" / ".run").unlink()
    os.mkfifo(run / ".manifest" / ".run")
    done = verify_in_a_process(run)
    assert done.returncode == 1
    assert f"{record}: not a regular file" in done.stdout
    assert f"{run / '.manifest' / '.run'}: not a run record" in done.stdout


def test_a_lock_file_planted_as_a_symlink_is_never_followed(run: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "created-by-the-recorder"
    target.parent.mkdir()
    lock = run / ".manifest" / ".run.flock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(target)
    (run / "stats" / "c.csv").write_text("x\n1\n")
    with pytest.raises(OSError, match=r"\.run\.flock is a symlink .*not followed"):
        manifest.record([run / "stats" / "c.csv"])
    assert not target.exists()


def test_a_key_that_cannot_be_created_is_one_line_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blockcoupling.files import seal_key

    (tmp_path / "file").write_text("")
    monkeypatch.setenv(seal_key.ENV, str(tmp_path / "file" / "seal.key"))  # under a file
    with pytest.raises(seal_key.SealKeyError) as error:
        seal_key.load(create=True)
    assert "\n" not in str(error.value) and seal_key.ENV in str(error.value)
