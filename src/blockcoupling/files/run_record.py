"""The run record: one file per results folder, ``results/.manifest/.run``, listing every
recorded result with its hash and sealed by a hash over that sorted list, so that ``verify``
sees a result deleted together with its per-file record (which the per-file records alone
cannot show) and a record added or changed by hand.

Each job adds its own outputs under an exclusive lock (``flock`` on a side file: jobs of one run,
also on Slurm nodes sharing the folder, update it in turn). The first job of a results folder
written before the run record existed adopts the per-file records there.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from blockcoupling.files.io import exclusive

NAME = ".run"  # in the manifest folder; no ".json" suffix, so never a per-file record


class RunRecordError(ValueError):
    """A run record that does not read as one."""


def seal(files: dict[str, str]) -> str:
    """The hash over the sorted list of ``files`` (relative path -> SHA-256)."""
    lines = "".join(f"{digest}  {path}\n" for path, digest in sorted(files.items()))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def read(path: Path) -> dict[str, str] | None:
    """The files of the run record at ``path`` (None: there is none); RunRecordError in one
    line naming it when it does not read, or its seal does not match its list.
    """
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files, sealed = data["files"], data["sha256"]
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise TypeError("'files' is not a mapping of paths to hashes")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise RunRecordError(
            f"{path}: not a run record ({type(error).__name__}: {error}); it cannot be trusted: "
            "rerun the workflow into a fresh results folder (or delete it: the next job starts "
            "one from the per-file records, blind to results deleted with theirs before)"
        ) from None
    if seal(files) != sealed:
        raise RunRecordError(
            f"{path}: its list does not match its seal (edited by hand); it cannot be trusted: "
            "rerun the workflow into a fresh results folder (or delete it: the next job starts "
            "one from the per-file records, blind to results deleted with theirs before)"
        )
    return files


def write_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, with the umask's permissions."""
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


def update(
    manifest: Path,
    added: dict[str, str],
    dropped: tuple[str, ...],
    adopt: Callable[[], dict[str, str]],
) -> None:
    """Add ``added`` (relative path -> SHA-256) to the run record of the manifest folder
    ``manifest``, first removing every entry under a folder of ``dropped`` (a directory output
    written anew); ``adopt``: the per-file records to start from when there is no run record.
    """
    path = manifest / NAME
    manifest.mkdir(parents=True, exist_ok=True)
    with exclusive(path.with_name(f"{path.name}.flock")):
        files = read(path)
        files = adopt() if files is None else files
        for folder in dropped:
            files = {k: v for k, v in files.items() if not k.startswith(folder + "/")}
        files.update(added)
        text = json.dumps({"files": files, "sha256": seal(files)}, indent=0, sort_keys=True)
        write_file(path, text + "\n")
