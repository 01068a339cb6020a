"""The hub lock file: the commit each fetched hub revision resolved to, as package managers lock
versions.

The fetch rules record, per dataset or model repo and requested revision (a branch, tag or
commit), the commit they downloaded; a fetch of a revision the lock already holds downloads
exactly that commit, on any machine, whatever the branch points to now. Commit the file (its
name: ``hub.lock_file``, default ``hub.lock`` in the working directory) to pin a run's inputs;
delete an entry (or the file) to take a branch's new head. Format (JSON, sorted)::

    {"datasets": {"allenai/ai2_arc": {"main": "<40 hex>"}}, "models": {"org/m": {"v1": "..."}},
     "files": {"<40 hex>": {"model.safetensors": "sha256:<64 hex>", "config.json": "git-sha1:..."}}}

``files``: the hub's content hash of each file fetched at a commit (``content``), which a
fetch of that commit must give again and the cache's manifest must hold.
"""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any

from blockcoupling.files.io import exclusive, write_text

KINDS = {"dataset": "datasets", "model": "models", "checkpoint": "models"}
HEADER = "commits of the hub revisions fetched (blockcoupling fetch rules); commit this file"
COMMIT = re.compile(r"[0-9a-f]{40}")
HASH = re.compile(r"(sha256:[0-9a-f]{64}|git-sha1:[0-9a-f]{40})")
FIX = "restore it from version control, or delete it to fetch the revisions' current commits"


class LockError(ValueError):
    """A lock file that cannot be read, or a hub cache that holds another commit than it."""


def read_lock(path: str | Path) -> dict[str, Any]:
    """The lock's content, checked as a whole (empty sections when the file does not exist):
    ``datasets`` and ``models`` map repo ids to ``{revision: commit}``, ``files`` maps a commit
    to ``{file: content hash}``; anything else is a LockError naming the file, the key and the
    fix.
    """
    path = Path(path)
    if path.is_dir():
        raise LockError(
            f"{path} is a folder, not a hub lock file: set hub.lock_file to a file (default "
            "hub.lock) or move the folder away"
        )
    if not path.exists():
        return {"datasets": {}, "models": {}, "files": {}}
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        first = (str(error).splitlines() or [type(error).__name__])[0]
        raise LockError(f"{path} is not a hub lock file ({first}); {FIX}") from None
    return _checked(data, path)


def _checked(data: Any, path: Path) -> dict[str, Any]:
    """``data`` (a lock file's JSON) if it has the lock's form, else LockError naming the key."""
    if not isinstance(data, dict):
        raise LockError(f"{path} is not a hub lock file (not a JSON object); {FIX}")
    unknown = sorted(set(data) - {"comment", "datasets", "models", "files"})
    if unknown:
        raise LockError(f"{path}: unknown key {unknown[0]!r} (datasets, models, files); {FIX}")
    for section in ("datasets", "models"):
        for repo, revisions in _mapping(data, section, path).items():
            if not isinstance(revisions, dict) or not all(
                isinstance(commit, str) and COMMIT.fullmatch(commit)
                for commit in revisions.values()
            ):
                raise LockError(
                    f"{path}: {section}.{repo} is not a mapping of revisions to 40-hex commits; "
                    f"{FIX}"
                )
    for commit, hashes in _mapping(data, "files", path).items():
        if not isinstance(hashes, dict) or not all(
            isinstance(h, str) and HASH.fullmatch(h) for h in hashes.values()
        ):
            raise LockError(
                f"{path}: files.{commit} is not a mapping of file names to content hashes "
                f"(sha256:<64 hex> or git-sha1:<40 hex>); {FIX}"
            )
    return {key: dict(data.get(key, {})) for key in ("datasets", "models", "files")}


def _mapping(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise LockError(f"{path}: {key} is {type(value).__name__} {value!r}, not a mapping; {FIX}")
    return value


def locked_commit(path: str | Path, kind: str, repo: str, revision: str) -> str | None:
    """The commit the lock holds for ``repo`` at ``revision`` (kind dataset, model or
    checkpoint), None when it holds none.
    """
    return read_lock(path)[KINDS[kind]].get(repo, {}).get(revision)


def record(
    path: str | Path,
    kind: str,
    repo: str,
    revision: str,
    commit: str,
    hashes: dict[str, str] | None = None,
) -> None:
    """Write ``commit`` for ``repo`` at ``revision`` (and the content ``hashes`` of its files)
    into the lock, atomically, keeping every other entry; nothing when the lock holds them
    already. A symlinked lock's target is rewritten (the link kept) with its own permissions;
    a read-only lock is refused (LockError naming it), untouched.
    """
    path = Path(path)
    target = path.resolve()
    with exclusive(target.with_name(f".{target.name}.flock")):
        data = read_lock(target)
        before = json.dumps(data, sort_keys=True)
        data[KINDS[kind]].setdefault(repo, {})[revision] = commit
        locked = data["files"].get(commit)
        if hashes and locked and locked != hashes:
            name = sorted(
                n for n in locked.keys() | hashes.keys() if locked.get(n) != hashes.get(n)
            )
            raise LockError(
                f"the hub gave {repo}@{revision} (commit {commit}) with other content than {path} "
                f"records for that commit (e.g. {name[0]}): a proxy or mirror that changes files; "
                f"fetch from the hub itself, or delete files.{commit} from {path} to trust this one"
            )
        if hashes:
            data["files"][commit] = dict(hashes)
        if target.exists() and json.dumps(data, sort_keys=True) == before:
            return
        mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
        if mode is not None and not mode & stat.S_IWUSR:
            raise LockError(
                f"{path} is read-only, so the commit fetched for {repo}@{revision} ({commit}) "
                f"cannot be recorded: make it writable (chmod u+w {path}), or set "
                "hub.lock_file: null to fetch without a lock"
            )
        text = json.dumps({"comment": HEADER, **data}, indent=1, sort_keys=True)
        write_text(target, text + "\n")
        if mode is not None:
            target.chmod(mode)  # its own permissions, not the umask's


def adopt(path: str | Path, kind: str, repo: str, revision: str, manifest: str | Path) -> None:
    """Record in the lock what a fetch's ``manifest`` says it fetched, where the lock holds no
    commit for ``repo`` at ``revision`` (a deleted lock, rewritten from the cache's manifests);
    nothing where the manifest does not read.
    """
    if locked_commit(path, kind, repo, revision) is not None:
        return
    try:
        fetched = json.loads(Path(manifest).read_text("utf-8"))
        commit, hashes = fetched["commit"], fetched.get("hashes") or None
    except (OSError, ValueError, KeyError, TypeError):
        return
    if isinstance(commit, str) and COMMIT.fullmatch(commit):
        record(path, kind, repo, revision, commit, hashes if isinstance(hashes, dict) else None)


def adopt_all(path: str | Path, fetched: list[tuple[str, str, str, str, str]]) -> list[str]:
    """``adopt`` every fetch of ``fetched`` (lock kind, repo, revision, folder, manifest) whose
    folder is in the cache (the workflow's onstart: a run with jobs, not a dry run); returns a
    line per fetch that could not be recorded (a read-only lock).
    """
    lines = []
    for kind, repo, revision, folder, manifest in fetched:
        if Path(folder).is_dir():
            try:
                adopt(path, kind, repo, revision, manifest)
            except LockError as error:
                lines.append(f"hub.lock_file: {error}")
    return lines


def stale(
    folder: str | Path, manifest: str | Path, lock: str | Path, kind: str, repo: str, revision: str
) -> str:
    """A one-line reason when a fetched folder holds (by its manifest) another commit than the
    lock pins (a lock file from another machine, or edited), or other content hashes than it
    records for that commit (every file's: a manifest without hashes, or without one file's,
    differs too), or when its manifest does not read; else "".
    """
    manifest = Path(manifest)
    lock_data = read_lock(lock)
    pinned = lock_data[KINDS[kind]].get(repo, {}).get(revision)
    if pinned is None or not manifest.is_file() or not Path(folder).is_dir():
        return ""
    try:
        fetched = json.loads(manifest.read_text("utf-8"))
        commit, hashes = fetched.get("commit"), fetched.get("hashes")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return (
            f"{manifest}, the manifest of the fetch of {repo}@{revision}, does not read: delete "
            f"it and {folder} to fetch again"
        )
    if commit != pinned:
        return (
            f"the hub cache holds {repo}@{revision} at commit {commit}, but {lock} pins "
            f"{pinned}: delete {folder} and {manifest} to fetch the pinned commit, or delete the "
            "lock entry to keep this one"
        )
    locked = lock_data["files"].get(pinned)
    if locked and not isinstance(hashes, dict):  # hashes deleted or emptied: nothing vouches
        hashes = {}
    if locked and hashes != locked:
        differ = sorted(n for n in locked.keys() | hashes.keys() if locked.get(n) != hashes.get(n))
        return (
            f"{manifest} lists other content hashes for {repo}@{revision} (commit {pinned}) than "
            f"{lock} records (e.g. {differ[0]}): delete {folder} and {manifest} to fetch it again"
        )
    return ""
