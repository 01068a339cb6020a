"""The hub lock file: the commit each fetched hub revision resolved to, as package managers lock
versions.

The fetch rules record, per dataset or model repo and requested revision (a branch, tag or
commit), the commit they downloaded; a fetch of a revision the lock already holds downloads
exactly that commit, on any machine, whatever the branch points to now. Commit the file (its
name: ``hub.lock_file``, default ``hub.lock`` in the working directory) to pin a run's inputs;
delete an entry (or the file) to take a branch's new head. Format (JSON, sorted)::

    {"datasets": {"allenai/ai2_arc": {"main": "<40 hex>"}}, "models": {"org/m": {"v1": "..."}}}
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from blockcoupling.files.io import write_text

KINDS = {"dataset": "datasets", "model": "models", "checkpoint": "models"}
HEADER = "commits of the hub revisions fetched (blockcoupling fetch rules); commit this file"


class LockError(ValueError):
    """A lock file that cannot be read, or a hub cache that holds another commit than it."""


def read_lock(path: str | Path) -> dict[str, Any]:
    """The lock's content (empty sections when the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return {"datasets": {}, "models": {}}
    try:
        data = json.loads(path.read_text("utf-8"))
        return {"datasets": dict(data.get("datasets", {})), "models": dict(data.get("models", {}))}
    except (ValueError, AttributeError) as error:
        raise LockError(
            f"{path} is not a hub lock file ({error}); restore it from version control or "
            "delete it to fetch the revisions' current commits"
        ) from None


def locked_commit(path: str | Path, kind: str, repo: str, revision: str) -> str | None:
    """The commit the lock holds for ``repo`` at ``revision`` (kind dataset, model or
    checkpoint), None when it holds none.
    """
    return read_lock(path)[KINDS[kind]].get(repo, {}).get(revision)


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``'s side file while the block runs (parallel fetch jobs
    record into one lock file).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.flock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def record(path: str | Path, kind: str, repo: str, revision: str, commit: str) -> None:
    """Write ``commit`` for ``repo`` at ``revision`` into the lock (atomically, keeping every
    other entry).
    """
    path = Path(path)
    with _exclusive(path):
        data = read_lock(path)
        data[KINDS[kind]].setdefault(repo, {})[revision] = commit
        text = json.dumps({"comment": HEADER, **data}, indent=1, sort_keys=True)
        write_text(path, text + "\n")


def stale(
    folder: str | Path, manifest: str | Path, lock: str | Path, kind: str, repo: str, revision: str
) -> str:
    """A one-line reason when a fetched folder holds (by its manifest) another commit than the
    lock pins (a lock file from another machine, or edited), else "".
    """
    manifest = Path(manifest)
    pinned = locked_commit(lock, kind, repo, revision)
    if pinned is None or not manifest.is_file() or not Path(folder).is_dir():
        return ""
    fetched = json.loads(manifest.read_text("utf-8")).get("commit")
    if fetched == pinned:
        return ""
    return (
        f"the hub cache holds {repo}@{revision} at commit {fetched}, but {lock} pins {pinned}: "
        f"delete {folder} and {manifest} to fetch the pinned commit, or delete the lock entry "
        "to keep this one"
    )
