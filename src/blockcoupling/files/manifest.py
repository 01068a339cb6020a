"""Content hashes of the results, recorded as each job produces them, and the check of a results
folder against them (``blockcoupling verify results/``).

A file ``results/<path>`` has its record ``results/.manifest/<path>.json`` (``{"sha256", "size",
"rule"}``): one small file per result, written atomically by the job that wrote the result, so
jobs running at once (on different Slurm nodes too) never write the same record; each job then
adds its records to the run record (``run_record``, sealed with a key kept outside the results),
which shows a result deleted together with its record. A job compares each recorded input with
its record before it reads it (``check_inputs``). The trainers' work folders
(``train/<run>/work-<key>`` of a recorded run, their resume state, checked by the trainer
itself) hold no results; anything else, symlinks, special files and every entry of the
manifest folder included, is checked. Imports nothing heavy: every job records its outputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from blockcoupling.coupling.arguments import expect_path
from blockcoupling.files import run_record, seal_key
from blockcoupling.files.run_record import write_file

RESULTS = "results"
MANIFEST = ".manifest"
_TEMP = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")  # a temp file of io.atomic_write
# Snakemake's marker inside a directory() output, written after the job (no result)
TIMESTAMP = ".snakemake_timestamp"
# the workflow's temp() outputs, deleted by Snakemake once merged: their records outlive them
TEMPORARY = re.compile(r"extract/[^/]+/[^/]+/shards/(tokens/)?[^/]+/[^/]+\.nc")
# the trainers' work folders (runtime.workdir.keyed_work_dir), their resume state: no results;
# each pattern anchored to one folder per part (a run's folder must hold recorded results too)
TRAINER_WORK = re.compile(r"(train/[^/]+|vit/train/sd[^/]+/wd[^/]+/seed[0-9]+)/work-[0-9a-f]{12}")


def results_root(path: str | Path) -> Path | None:
    """The nearest folder named ``results`` holding ``path`` (None: not a result)."""
    for parent in Path(path).absolute().parents:
        if parent.name == RESULTS:
            return parent
    return None


def sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_path(root: Path, path: Path) -> Path:
    """Where the record of ``path`` (a file under ``root``) lives."""
    relative = path.absolute().relative_to(root.absolute())
    return root / MANIFEST / relative.parent / f"{relative.name}.json"


def record(paths: Iterable[str | Path], rule: str = "") -> None:
    """Record the hash of every file of ``paths`` under a ``results`` folder, and of every file
    inside a folder of ``paths`` (a ``directory()`` output); others: nothing. Each record
    (with ``rule``, the rule that wrote it) is written atomically with the umask's permissions,
    then added to the folder's run record.
    """
    added: dict[Path, dict[str, str]] = {}
    dropped: dict[Path, list[str]] = {}
    _record(map(Path, paths), added, dropped, rule)
    for root in added.keys() | dropped.keys():
        run_record.update(
            root / MANIFEST,
            added.get(root, {}),
            tuple(dropped.get(root, [])),
            lambda root=root: recorded(root),
        )


def _record(
    paths: Iterable[Path],
    added: dict[Path, dict[str, str]],
    dropped: dict[Path, list[str]],
    rule: str,
) -> None:
    """Write the per-file records of ``paths``; collect, per results root, the hashes written
    (``added``) and the directory outputs written anew (``dropped``).
    """
    for path in paths:
        root = results_root(path)
        if root is None:
            continue
        if path.is_dir():  # its records are replaced: none of a file it no longer holds
            records = record_path(root, path).with_suffix("")
            shutil.rmtree(records, ignore_errors=True)
            dropped.setdefault(root, []).append(_relative(root, path))
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.name != TIMESTAMP)
            _record(files, added, dropped, rule)
            continue
        if not path.is_file():
            continue
        entry = {"sha256": sha256(path), "size": path.stat().st_size, "rule": rule}
        write_file(record_path(root, path), json.dumps(entry, sort_keys=True) + "\n")
        added.setdefault(root, {})[_relative(root, path)] = entry["sha256"]


def _relative(root: Path, path: Path) -> str:
    return path.absolute().relative_to(root.absolute()).as_posix()


def _entries(root: Path, records: dict[str, str]) -> Iterator[tuple[Path, str]]:
    """``(path, kind)`` of every entry under ``root`` to check, sorted: ``link`` (a symlink: a
    symlinked folder is given, not followed), ``special`` (a FIFO, socket or device: never
    opened), ``stray`` (an entry of the manifest folder that is no record, nor the run record or
    its lock file), ``file`` (a result). Skipped: the per-file records, the work folders of the
    trainers of runs with recorded results (``records``: relative path -> hash), Snakemake's
    directory timestamps.
    """
    for folder, subfolders, files in os.walk(root):
        here = Path(folder)
        in_records = _relative(root, here).split("/")[0] == MANIFEST
        kept = []
        for name in sorted(subfolders):
            if (here / name).is_symlink():
                yield here / name, "link"
            elif not _trainer_work(_relative(root, here / name), records):
                kept.append(name)
        subfolders[:] = kept
        for name in sorted(files):
            path = here / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                yield path, "link"
            elif not stat.S_ISREG(mode):
                yield path, "special"
            elif in_records:
                if not _record_entry(root, path):
                    yield path, "stray"
            elif name != TIMESTAMP:
                yield path, "file"


def _trainer_work(relative: str, records: dict[str, str]) -> bool:
    """Whether ``relative`` is a trainer's work folder: its pattern, beside recorded results of
    its run (a folder merely named so elsewhere is checked as results).
    """
    if not TRAINER_WORK.fullmatch(relative):
        return False
    run = relative.rsplit("/", 1)[0] + "/"
    return any(path.startswith(run) for path in records)


def _record_entry(root: Path, path: Path) -> bool:
    """Whether ``path`` (a regular file of the manifest folder) is a per-file record (``.json``,
    not a temp file), the run record or the run record's lock file.
    """
    if path.parent == root / MANIFEST and path.name in (run_record.NAME, run_record.LOCK):
        return True
    return path.name.endswith(".json") and not _TEMP.fullmatch(path.name)


class ChangedInput(ValueError):
    """A job's input that differs from the record its producing job wrote."""


def check_inputs(paths: Iterable[str | Path]) -> tuple[int, int]:
    """Compare every recorded input of a job (a file under a ``results`` folder with a
    record, or such a file inside an input folder) with its record, size then streamed
    SHA-256, before the job reads it; ChangedInput in one line naming the first that differs,
    the rule that wrote it and the command that makes it again. Unrecorded inputs (outside
    ``results``, the hub cache's own checks) are left to their readers. Returns how many files
    were checked and their bytes.
    """
    checked = size = 0
    for path in map(Path, paths):
        root = results_root(path)
        if root is None:
            continue
        if path.is_dir() and not path.is_symlink():
            files = sorted(p for p in path.rglob("*") if p.name != TIMESTAMP)
            count, total = check_inputs(p for p in files if not p.is_dir() or p.is_symlink())
            checked, size = checked + count, size + total
            continue
        entry_path = record_path(root, path)
        if not entry_path.exists() and not entry_path.is_symlink():
            continue
        entry = _read_record(entry_path)
        mode = path.lstat().st_mode
        if entry is None:
            why = f"its record {entry_path} does not read"
        elif not stat.S_ISREG(mode):
            why = "it is not a regular file (a symlink or special file; not opened)"
        elif path.stat().st_size != entry["size"] or sha256(path) != entry["sha256"]:
            why = f"it differs from its record {entry_path}"
        else:
            checked, size = checked + 1, size + int(entry["size"])
            continue
        rule = entry.get("rule") if entry else None
        raise ChangedInput(
            f"input {path}: {why} (written by rule {rule or 'unknown'}), it changed after that "
            f"job wrote it; make it again: snakemake --cores 1 --force {path} (with the run's "
            "--configfile and --directory), then rerun"
        )
    return checked, size


def recorded(root: Path) -> dict[str, str]:
    """Every per-file record under ``root``'s manifest folder, as relative path -> SHA-256 (an
    unreadable record: its hash "").
    """
    records = root / MANIFEST
    found = {}
    for entry in sorted(records.rglob("*.json")):
        if not entry.is_file() or entry.is_symlink():  # named by verify, never opened
            continue
        relative = entry.relative_to(records).with_name(entry.name.removesuffix(".json"))
        found[relative.as_posix()] = (_read_record(entry) or {}).get("sha256", "")
    return found


def _read_record(path: Path) -> dict[str, object] | None:
    """A per-file record's ``{"sha256", "size"}`` (and ``rule``); None when it does not read as
    one (a symlink or special file is not opened).
    """
    try:
        entry = json.loads(run_record.read_regular(path).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("sha256"), str)
        or not isinstance(entry.get("size"), int)
    ):
        return None
    return entry


def _missing(root: Path) -> Iterator[Path]:
    """The recorded results under ``root`` whose file is gone (but TEMPORARY ones), sorted."""
    for relative in recorded(root):
        if not (root / relative).exists() and not TEMPORARY.fullmatch(relative):
            yield root / relative


def verify(root: str | Path) -> list[str]:
    """Check a results folder against the content hash each job recorded.

    Parameters
    ----------
    root : str or pathlib.Path
        A workflow's ``results/`` folder.

    Returns
    -------
    list of str
        One line per problem, empty when all hold: a symlink, a special file (never opened), a
        leftover temp file, a file with no record, an entry of the manifest folder that is no
        record, an unreadable record, a file that differs from its record or does not open as
        its type, a recorded file that is gone, and against the run record: a record it does
        not list or lists with another hash, a file it lists whose record is gone too (deleted
        together), a run record that does not read, whose keyed seal does not hold or cannot be
        checked (no key here), or that a job started anew from the per-file records.

    Examples
    --------
    >>> import blockcoupling as bc
    >>> bc.verify("results") or "every file matches its record"  # doctest: +SKIP
    """
    expect_path(root, "verify(root=...)")
    root = Path(root)
    if not (root / MANIFEST).is_dir() or (root / MANIFEST).is_symlink():
        raise ValueError(
            f"{root} has no {MANIFEST} folder: not a results folder written by this workflow"
        )
    problems = []
    for path, kind in _entries(root, recorded(root)):
        if kind == "link":
            problems.append(
                f"{path}: a symlink (to {os.readlink(path)}), not a result its job wrote; delete "
                "the link and rerun the workflow"
            )
        elif kind == "special":
            problems.append(
                f"{path}: not a regular file (a FIFO, socket or device; not opened), not a "
                "result its job wrote; delete it and rerun the workflow"
            )
        elif kind == "stray":
            problems.append(
                f"{path}: in {MANIFEST} but not a record of a result (nor the run record); "
                "delete it and rerun the workflow"
            )
        else:
            problems += _file_problems(root, path)
    for path in _missing(root):
        problems.append(
            f"{path}: recorded but missing (deleted since its job wrote it); rerun the workflow"
        )
    return problems + _run_problems(root)


def _file_problems(root: Path, path: Path) -> list[str]:
    """What is wrong with one file under ``root`` against its per-file record."""
    if _TEMP.fullmatch(path.name):
        return [f"{path}: a temp file of an interrupted write; delete it"]
    entry_path = record_path(root, path)
    if entry_path.is_symlink():  # named as a symlink, never followed
        return []
    if not entry_path.is_file():
        return [f"{path}: no record in {MANIFEST} (not written by a workflow job)"]
    entry = _read_record(entry_path)
    if entry is None:
        return [
            f"{entry_path}: not a record of {path} (no JSON with its sha256 and size); delete "
            "both and rerun the workflow"
        ]
    if path.stat().st_size != entry["size"] or sha256(path) != entry["sha256"]:
        return [f"{path}: differs from its record (changed since its job wrote it)"]
    error = open_error(path)
    return [] if error is None else [f"{path}: does not open ({error})"]


def _run_problems(root: Path) -> list[str]:
    """The per-file records against the run record: one line per difference."""
    where = root / MANIFEST / run_record.NAME
    try:
        key = seal_key.load()
        read = run_record.read(where, key)
    except (run_record.RunRecordError, seal_key.SealKeyError) as error:
        return [str(error)]
    if read is None:
        return [
            f"{where}: no run record (deleted, or never written: every job adds to it), so a "
            "result deleted with its record cannot be seen; rerun the workflow into a fresh "
            "results folder"
        ]
    problems = []
    if not read.checked:
        problems.append(
            f"{where}: its seal cannot be checked: no seal key at {seal_key.location()} (the "
            f"key of the account whose jobs wrote it; set {seal_key.ENV} to its file), so a "
            "consistent forgery of results, records and run record cannot be told apart"
        )
    if read.started:
        problems.append(
            f"{where}: started anew from the per-file records ({read.started}), so results "
            "deleted together with their records before then cannot be seen; rerun the "
            "workflow into a fresh results folder"
        )
    listed = read.files
    records = recorded(root)
    for relative in sorted(listed.keys() - records.keys()):
        if not TEMPORARY.fullmatch(relative) and not (root / relative).exists():
            problems.append(
                f"{root / relative}: in the run record, but the file and its record are gone "
                "(deleted together); rerun the workflow"
            )
    for relative in sorted(records.keys() - listed.keys()):
        problems.append(
            f"{root / relative}: has a record but is not in the run record {where} (a record "
            "not written by a workflow job); delete both and rerun the workflow"
        )
    for relative in sorted(records.keys() & listed.keys()):
        if records[relative] and records[relative] != listed[relative]:
            problems.append(
                f"{root / relative}: its record differs from the run record {where} (a record "
                "edited by hand); rerun the workflow"
            )
    return problems


def open_error(path: Path) -> str | None:
    """Why ``path`` does not open as its type (NetCDF, CSV, PNG, PDF, JSON, safetensors), or None
    (also for types not checked).
    """
    suffix = path.suffix.lower()
    try:
        if suffix == ".nc":
            import xarray as xr

            with xr.open_dataset(path, engine="netcdf4") as dataset:
                dataset.load()
        elif suffix == ".csv":
            import pandas as pd

            pd.read_csv(path)
        elif suffix == ".png":
            from PIL import Image

            with Image.open(path) as image:
                image.load()
        elif suffix == ".pdf":
            data = path.read_bytes()
            if not data.startswith(b"%PDF-") or b"%%EOF" not in data[-1024:]:
                return "no PDF header or end-of-file marker"
        elif suffix in (".json", ".jsonl"):
            text = path.read_text(encoding="utf-8")
            for line in text.splitlines() if suffix == ".jsonl" else [text]:
                if line.strip():
                    json.loads(line)
        elif suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(path, framework="numpy") as tensors:
                list(tensors.keys())
    except Exception as error:  # noqa: BLE001 (any failure to open is the answer)
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return first
    return None
