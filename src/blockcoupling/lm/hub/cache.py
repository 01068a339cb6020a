"""The hub cache on disk: the folders ``hub`` fetched (model revisions and prompt datasets, where
the network is), read back offline by compute jobs, and their manifests; a folder is checked
against its manifest (every file present, each with its size and content hash) before use.

Layout under ``cache_dir``: ``models/<repo>/<revision>`` (revisions kept), ``checkpoints/<repo>/
<revision>`` (revision_template steps, deleted once their jobs are done), ``datasets/<repo>/
<revision>``, and ``manifests/<kind>/<repo>/<revision>.json`` (what each fetch wrote; kept).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blockcoupling.files.io import write_text
from blockcoupling.lm.hub import content
from blockcoupling.lm.hub.lock import HASH


class HubCacheError(OSError):
    """A revision or dataset the job needs is not in the hub cache."""


def write_manifest(manifest: dict[str, Any], path: str | Path) -> None:
    """Write a fetch's manifest as JSON, atomically."""
    write_text(path, json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def checkpoints_on_disk(cache_dir: str | Path) -> int:
    """How many checkpoint revision folders the cache holds now."""
    root = Path(cache_dir) / "checkpoints"
    folders = {path.parent for path in root.rglob("config.json")}
    # not the private folders of fetches under way (``.<revision>.partial-*``), nor older ones
    return sum(
        1
        for folder in folders
        if not folder.name.endswith(".partial") and not folder.name.startswith(".")
    )


KINDS = {"models": "model", "checkpoints": "checkpoint", "datasets": "dataset"}


def manifest_of(folder: str | Path) -> Path | None:
    """The manifest a fetch wrote for a folder of the cache (``HubSettings.folder``:
    ``<kind>s/<repo>/<revision>``, ``dataset_folder``: ``datasets/<repo>/<revision>``), where
    it exists;
    None otherwise.
    """
    folder = Path(folder)
    for top in list(folder.parents)[:3]:  # the repo id has one or two parts
        kind = KINDS.get(top.name)
        if kind is None:
            continue
        candidate = top.parent / "manifests" / kind / f"{folder.relative_to(top)}.json"
        if candidate.is_file():
            return candidate
    return None


def missing_files(folder: str | Path) -> list[str] | None:
    """The files a fetched folder's manifest lists that are missing or of another size ([]:
    complete); None where there is no manifest or no folder.
    """
    manifest = manifest_of(folder)
    if manifest is None or not Path(folder).is_dir():
        return None
    try:
        files = json.loads(manifest.read_text("utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    missing = []
    for name, size in sorted(files.items()):
        path = Path(folder) / name
        if not path.is_file() or path.stat().st_size != size:
            missing.append(name)
    return missing


def _hashes(folder: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(files, hashes)`` of a fetched folder's manifest ({} for what it lacks)."""
    manifest = manifest_of(folder)
    if manifest is None:
        return {}, {}
    try:
        fetched = json.loads(manifest.read_text("utf-8"))
        files, hashes = fetched.get("files"), fetched.get("hashes")
    except (OSError, ValueError, AttributeError):
        return {}, {}
    return (
        files if isinstance(files, dict) else {},
        hashes if isinstance(hashes, dict) else {},
    )


def unhashed_files(folder: str | Path) -> list[str]:
    """The files a fetched folder's manifest lists without a content hash of the form a fetch
    records (the hub hashes every file: a manifest whose ``hashes`` were deleted, emptied or
    thinned cannot vouch for the bytes).
    """
    files, hashes = _hashes(folder)
    return sorted(
        name
        for name in files
        if not isinstance(hashes.get(name), str) or not HASH.fullmatch(hashes[name])
    )


def damaged_files(folder: str | Path) -> list[str]:
    """The files of a fetched folder whose bytes differ from the hashes its manifest recorded
    at fetch time (the hub's own; a streaming hash of each); files listed without a hash are
    ``unhashed_files``.
    """
    files, hashes = _hashes(folder)
    known = {
        name: hashes[name] for name in files if name in hashes and isinstance(hashes[name], str)
    }
    return content.damaged(folder, known)


def fetch_command(folder: str | Path, repo: str, revision: str) -> str:
    """The command that fetches exactly one revision into its folder (with its manifest)."""
    return f"blockcoupling fetch {repo} {revision} {folder}"


def incomplete(folder: str | Path, what: str, repo: str, revision: str) -> str | None:
    """One line where ``folder`` (the fetched revision ``repo`` at ``revision``, ``what``: e.g.
    the model) is missing or incomplete against its manifest, naming the command that fetches
    exactly it; None where it is complete.
    """
    where = Path(folder)
    missing = missing_files(where)
    if missing == []:
        return None
    if not where.is_dir():
        state = "is not in the hub cache"
    elif missing is None:
        state = "has no manifest in the hub cache (an interrupted or foreign fetch)"
    else:
        state = f"is incomplete in the hub cache ({len(missing)} files missing, e.g. {missing[0]})"
    return (
        f"{what}: revision {revision} of {repo} {state} ({where}); fetch exactly it where the "
        f"network is (the login node): {fetch_command(where, repo, revision)}, and check that "
        "hub.cache_dir is on a filesystem the nodes share"
    )


def require(folder: str | Path, what: str, repo: str = "", revision: str = "main") -> Path:
    """The fetched folder of ``what`` (a revision or dataset): there, with every file its
    manifest lists, each with the content hash it recorded; else one error naming it and the
    fix (compute jobs are offline: they never download). ``repo``: the hub id, for the fetch
    command ('': a dataset, fetched by the fetch target).
    """
    folder = Path(folder)
    if repo:
        line = incomplete(folder, what, repo, revision)
        if line is not None:
            raise HubCacheError(line)
        fix = f"rm -r {folder}, then {fetch_command(folder, repo, revision)}"
    elif missing_files(folder) != []:
        raise HubCacheError(
            f"{what} is not (completely) in the hub cache ({folder}); fetch it where the "
            f"network is (snakemake --cores 1 fetch, on the login node) and check "
            "hub.cache_dir is shared"
        )
    else:
        fix = f"rm -r {folder}, then snakemake --cores 1 fetch"
    unhashed = unhashed_files(folder)
    if unhashed:
        raise HubCacheError(
            f"{what}: {manifest_of(folder)} lists {folder / unhashed[0]} without the content "
            f"hash the hub gives every file ({len(unhashed)} such files): its bytes cannot be "
            f"checked; fetch it again where the network is: {fix}"
        )
    damaged = damaged_files(folder)
    if damaged:
        raise HubCacheError(
            f"{what}: {folder / damaged[0]} differs from the hash the hub gave it at fetch time "
            f"({len(damaged)} such files; {manifest_of(folder)}): the file is damaged or was "
            f"changed; fetch it again where the network is: {fix}"
        )
    return folder
