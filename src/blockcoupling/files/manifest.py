"""Content hashes of the results, recorded as each job produces them, and the check of a results
folder against them (``blockcoupling verify results/``).

A file ``results/<path>`` has its record ``results/.manifest/<path>.json`` (``{"sha256", "size"}``):
one small file per result, written atomically by the job that wrote the result, so jobs running
at once (on different Slurm nodes too) never write the same record. Training work folders
(``work-*``, the trainer's resume state, checked by the trainer itself) hold no results.
Imports nothing heavy: every job records its outputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

RESULTS = "results"
MANIFEST = ".manifest"
_TEMP = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")  # a temp file of io.atomic_write
# Snakemake's marker inside a directory() output, written after the job (no result)
TIMESTAMP = ".snakemake_timestamp"
# the workflow's temp() outputs, deleted by Snakemake once merged: their records outlive them
TEMPORARY = re.compile(r"extract/[^/]+/[^/]+/shards/.+")


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


def record(paths: Iterable[str | Path]) -> None:
    """Record the hash of every file of ``paths`` under a ``results`` folder, and of every file
    inside a folder of ``paths`` (a ``directory()`` output); others: nothing. Each record is
    written atomically with the umask's permissions.
    """
    for path in map(Path, paths):
        root = results_root(path)
        if root is None:
            continue
        if path.is_dir():  # its records are replaced: none of a file it no longer holds
            records = record_path(root, path).with_suffix("")
            shutil.rmtree(records, ignore_errors=True)
            record(sorted(p for p in path.rglob("*") if p.is_file() and p.name != TIMESTAMP))
            continue
        if not path.is_file():
            continue
        entry = {"sha256": sha256(path), "size": path.stat().st_size}
        _write(record_path(root, path), json.dumps(entry, sort_keys=True) + "\n")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(temp, 0o666 & ~mask)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _results(root: Path) -> Iterator[Path]:
    """Every file under ``root`` but the manifest, training work folders and Snakemake's
    directory timestamps, sorted.
    """
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(s for s in subfolders if s != MANIFEST and not s.startswith("work-"))
        for name in sorted(files):
            if name != TIMESTAMP:
                yield Path(folder) / name


def _missing(root: Path) -> Iterator[Path]:
    """The recorded results under ``root`` whose file is gone (but TEMPORARY ones), sorted."""
    records = root / MANIFEST
    for entry in sorted(records.rglob("*.json")):
        relative = entry.relative_to(records).with_name(entry.name.removesuffix(".json"))
        if not (root / relative).exists() and not TEMPORARY.fullmatch(relative.as_posix()):
            yield root / relative


def verify(root: str | Path) -> list[str]:
    """One line per file under ``root`` (a results folder) that is a leftover temp file, has no
    record, differs from its record, or does not open as its type, and per recorded file that
    is gone; empty when all hold.
    """
    root = Path(root)
    if not (root / MANIFEST).is_dir():
        raise ValueError(
            f"{root} has no {MANIFEST} folder: not a results folder written by this workflow"
        )
    problems = []
    for path in _results(root):
        if _TEMP.fullmatch(path.name):
            problems.append(f"{path}: a temp file of an interrupted write; delete it")
            continue
        entry_path = record_path(root, path)
        if not entry_path.is_file():
            problems.append(f"{path}: no record in {MANIFEST} (not written by a workflow job)")
            continue
        entry = json.loads(entry_path.read_text(encoding="utf-8"))
        if path.stat().st_size != entry["size"] or sha256(path) != entry["sha256"]:
            problems.append(f"{path}: differs from its record (changed since its job wrote it)")
            continue
        error = open_error(path)
        if error is not None:
            problems.append(f"{path}: does not open ({error})")
    for path in _missing(root):
        problems.append(
            f"{path}: recorded but missing (deleted since its job wrote it); rerun the workflow"
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
