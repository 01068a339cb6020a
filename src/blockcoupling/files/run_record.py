"""The run record: one file per results folder, ``results/.manifest/.run``, listing every
recorded result with its hash and sealed by an HMAC over that sorted list under a key kept
outside the results (``seal_key``), so that ``verify`` sees a result deleted together with its
per-file record (which the per-file records alone cannot show), a record added or changed by
hand, and a run record rewritten and resealed without the key.

Each job adds its own outputs under an exclusive lock (``flock`` on a side file: jobs of one run,
also on Slurm nodes sharing the folder, update it in turn). A job that finds no run record (a
folder from before run records, or one whose run record was deleted) starts one from the
per-file records there and says so in it (``started``): ``verify`` names such a folder, since
results deleted with their records before then cannot be seen.
"""

from __future__ import annotations

import hmac
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from blockcoupling.files import seal_key
from blockcoupling.files.io import exclusive

NAME = ".run"  # in the manifest folder; no ".json" suffix, so never a per-file record
LOCK = ".run.flock"  # the side file the jobs lock
RERUN = "rerun the workflow into a fresh results folder"


class RunRecordError(ValueError):
    """A run record that does not read as one, or whose seal does not hold."""


@dataclass(frozen=True)
class Listed:
    """A run record read back: ``files`` (relative path -> SHA-256); ``checked``: whether its
    seal was checked (False: no key here); ``started``: why it was started from the per-file
    records ("" when the folder's first job started it).
    """

    files: dict[str, str]
    checked: bool
    started: str


def seal(files: dict[str, str], started: str, key: bytes) -> str:
    """The HMAC under ``key`` over the sorted list of ``files`` and ``started``."""
    lines = "".join(f"{digest}  {path}\n" for path, digest in sorted(files.items()))
    return seal_key.mac(key, f"started: {started}\n{lines}")


def read_regular(path: Path) -> bytes:
    """The bytes of ``path``, opened without following a symlink nor blocking on a FIFO; an
    OSError naming it where it is not a regular file (never opened for reading then).
    """
    handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(handle, "rb") as source:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return source.read()


def read(path: Path, key: bytes | None) -> Listed | None:
    """The run record at ``path`` (None: there is none), its seal checked under ``key`` (None:
    not checked); RunRecordError in one line naming it when it does not read, was sealed
    without a key (an older version), with another key, or its seal does not hold.
    """
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
        files = data["files"]
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise TypeError("'files' is not a mapping of paths to hashes")
        if "hmac_sha256" not in data:
            raise KeyError("'hmac_sha256': sealed without a key (an older version)")
        sealed, sealer, started = data["hmac_sha256"], data["key_id"], data.get("started", "")
        if not all(isinstance(v, str) for v in (sealed, sealer, started)):
            raise TypeError("its seal is not text")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise RunRecordError(
            f"{path}: not a run record ({type(error).__name__}: {error}); it cannot be trusted: "
            f"{RERUN}"
        ) from None
    if key is None:
        return Listed(files, False, started)
    if sealer != seal_key.key_id(key):
        raise RunRecordError(
            f"{path}: sealed with another key ({sealer}) than {seal_key.location()} "
            f"({seal_key.key_id(key)}): set {seal_key.ENV} to the key of the account that ran "
            f"the jobs, or {RERUN}"
        )
    if not hmac.compare_digest(seal(files, started, key), sealed):
        raise RunRecordError(
            f"{path}: its list does not match its seal (edited after its jobs wrote it); it "
            f"cannot be trusted: {RERUN}"
        )
    return Listed(files, True, started)


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
    written anew), and seal it with the seal key (created on first use); ``adopt``: the
    per-file records to start from when there is no run record (or one an older version sealed
    without a key), which the record then says.
    """
    path = manifest / NAME
    manifest.mkdir(parents=True, exist_ok=True)
    key = seal_key.load(create=True)
    assert key is not None
    with exclusive(manifest / LOCK):
        try:
            listed = read(path, key)
        except RunRecordError as error:
            if "an older version" not in str(error):
                raise
            listed = None
            reason = "an older version's run record, sealed without a key"
        else:
            reason = "no run record (deleted, or a folder from before run records)"
        if listed is None:
            files = adopt()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            # a folder's first job finds only its own records: nothing before it to miss
            started = f"{stamp}: {reason}" if files.keys() - added.keys() else ""
        else:
            files, started = listed.files, listed.started
        for folder in dropped:
            files = {k: v for k, v in files.items() if not k.startswith(folder + "/")}
        files.update(added)
        record = {
            "files": files,
            "started": started,
            "key_id": seal_key.key_id(key),
            "hmac_sha256": seal(files, started, key),
        }
        write_file(path, json.dumps(record, indent=0, sort_keys=True) + "\n")
