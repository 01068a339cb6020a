"""Content hashes of fetched hub files, the hub's own: an LFS file's SHA-256 (``sha256:<hex>``),
another file's git blob id (``git-sha1:<hex>``), as ``HfApi.repo_info(files_metadata=True)``
gives them. Recorded at fetch time (a file the hub gives no hash for: its SHA-256 then) and
checked by a streaming hash before a job loads the folder, so a damaged file of the right size
stops the job instead of moving its results.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

BLOCK = 1 << 20


def hub_hash(sibling: Any) -> str | None:
    """The hash the hub gives a file (a ``RepoSibling`` of ``files_metadata=True``), or None."""
    lfs = getattr(sibling, "lfs", None)
    if lfs:
        sha = lfs["sha256"] if isinstance(lfs, dict) else lfs.sha256
        return f"sha256:{sha}"
    blob = getattr(sibling, "blob_id", None)
    return f"git-sha1:{blob}" if blob else None


def file_hash(path: str | Path, kind: str = "sha256") -> str:
    """``kind:<hex>`` of a file's bytes, read in blocks: ``sha256`` or ``git-sha1`` (git's blob
    id: SHA-1 of ``blob <size>``, a NUL byte, and the bytes).
    """
    path = Path(path)
    if kind == "git-sha1":
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(b"blob %d\0" % path.stat().st_size)
    elif kind == "sha256":
        digest = hashlib.sha256()
    else:
        raise ValueError(f"unknown hash kind {kind!r} (sha256 or git-sha1)")
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return f"{kind}:{digest.hexdigest()}"


def matches(path: str | Path, recorded: str) -> bool:
    """Whether the file at ``path`` has the recorded hash (``kind:<hex>``)."""
    kind = recorded.partition(":")[0]
    return kind in ("sha256", "git-sha1") and file_hash(path, kind) == recorded


def fetched_hashes(
    folder: Path, names: Iterable[str], siblings: Iterable[Any] | None
) -> tuple[dict[str, str], list[str]]:
    """``(hashes, differing)``: the hash to record for each of ``names`` (files of ``folder``,
    just downloaded) and the names whose bytes differ from the hash the hub gives them.
    """
    given = {s.rfilename: hub_hash(s) for s in siblings or []}
    hashes, differing = {}, []
    for name in sorted(names):
        expected = given.get(name)
        if expected is None:
            hashes[name] = file_hash(folder / name)
        elif matches(folder / name, expected):
            hashes[name] = expected
        else:
            differing.append(name)
    return hashes, differing


def damaged(folder: str | Path, hashes: dict[str, str]) -> list[str]:
    """The files of ``folder`` whose bytes differ from ``hashes`` (name -> recorded hash)."""
    folder = Path(folder)
    return [
        name
        for name, recorded in sorted(hashes.items())
        if not (folder / name).is_file() or not matches(folder / name, recorded)
    ]
