"""The hub cache: model revisions and prompt datasets fetched once, where the network is (the
login node), into plain folders of a shared cache that compute jobs read offline.

Layout under ``cache_dir``: ``models/<repo>/<revision>`` (revisions kept), ``checkpoints/<repo>/
<revision>`` (revision_template steps, deleted once their jobs are done), ``datasets/<repo>/
<revision>``, and ``manifests/<kind>/<repo>/<revision>.json`` (what each fetch wrote; kept). The
commit each fetch resolved goes into the lock file (``lockfile``, ``lock_file``), which later
fetches follow.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockcoupling.files.io import write_text
from blockcoupling.lm import content
from blockcoupling.lm.hub_names import check_fetch_folder

# What loading a causal LM needs besides its weights: config, generation config, tokenizer
# (tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab/merges, sentencepiece).
MODEL_FILES = ("*.json", "*.txt", "*.model", "*.tiktoken")
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


class HubCacheError(OSError):
    """A revision or dataset the job needs is not in the hub cache."""


def go_online() -> None:
    """Undo the jobs' offline switches in this process (the fetch scripts, before importing
    huggingface_hub, which reads them once at import; imported already with neither set: nothing
    to undo).
    """
    if "huggingface_hub" in sys.modules and any(os.environ.get(name) for name in OFFLINE):
        raise RuntimeError("go_online() must run before huggingface_hub is imported")
    for name in OFFLINE:
        os.environ.pop(name, None)


def _download(
    repo: str, revision: str, repo_type: str, patterns: list[str], target: Path, info: Any = None
) -> dict[str, Any]:
    """snapshot_download the files matching ``patterns`` at ``revision`` into ``target`` (written
    beside it, then renamed, so a folder that exists is complete; ``info``: the repo info at
    ``revision``, when already asked); returns its manifest.
    """
    from huggingface_hub import HfApi, snapshot_download

    info = info or HfApi().repo_info(
        repo, repo_type=repo_type, revision=revision, files_metadata=True
    )
    partial = target.with_name(target.name + ".partial")
    _remove(partial)
    snapshot_download(
        repo,
        repo_type=repo_type,
        revision=info.sha,
        allow_patterns=patterns,
        local_dir=partial,
    )
    shutil.rmtree(partial / ".cache", ignore_errors=True)  # huggingface_hub's download state
    files = {
        str(path.relative_to(partial)): path.stat().st_size
        for path in sorted(partial.rglob("*"))
        if path.is_file()
    }
    if not files:
        raise HubCacheError(f"{repo}@{revision}: no file matches {patterns}")
    hashes, differing = content.fetched_hashes(partial, files, info.siblings)
    if differing:
        raise HubCacheError(
            f"{repo}@{revision}: {differing[0]} as downloaded differs from the hash the hub gives "
            f"it ({len(differing)} such files): a damaged download or a proxy that changes "
            "files; fetch again"
        )
    _remove(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(target)
    return {
        "repo": repo,
        "repo_type": repo_type,
        "revision": revision,
        "commit": info.sha,
        "files": files,
        "hashes": hashes,
        "bytes": sum(files.values()),
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _remove(path: Path) -> None:
    """Delete ``path`` (a folder of the fetch's own, checked by ``check_fetch_folder``): a
    symlink put there is unlinked, never followed.
    """
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


# Exceptions (by class name, anywhere in the class's MRO) that mean the hub was not reached:
# huggingface_hub's HTTP client (httpx's transport errors), requests', and its own fallback.
UNREACHABLE = ("TransportError", "ConnectionError", "LocalEntryNotFoundError", "TimeoutError")


def endpoint() -> str:
    """The hub's address (``HF_ENDPOINT``, else huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


def hub_fault(
    error: Exception,
    repo: str,
    revision: str,
    pinned: tuple[str, str] | None = None,
    what: str = "",
    folder: str | Path | None = None,
) -> HubCacheError | None:
    """One line for a hub that could not be reached, or that refused ``repo`` at ``revision``
    (None: another error, left as it is); ``pinned``: ``(commit, lock file)`` when the fetch
    asked for the commit a lock file pins instead; ``what``: the config keys that need it
    (``models.KEY``), which open the line; ``folder``: where it goes, for the fetch command.
    """
    names = {cls.__name__ for cls in type(error).__mro__}
    short = (str(error).splitlines() or [""])[0][:200]
    if names & set(UNREACHABLE):
        command = (
            f", or fetch exactly it where the network is: {fetch_command(folder, repo, revision)}"
            if folder is not None
            else ""
        )
        return HubCacheError(
            f"{f'{what}: ' if what else ''}cannot reach the hub at {endpoint()} to fetch {repo} "
            f"at revision {revision} ({type(error).__name__}: {short}): check this machine's "
            "network (fetch rules run where Snakemake runs: the login node), HF_ENDPOINT and "
            f"HTTPS_PROXY, then rerun{command}"
        )
    if "HfHubHTTPError" in names and pinned:
        commit, lock = pinned
        return HubCacheError(
            f"the hub at {endpoint()} refused {repo} at commit {commit}, which {lock} pins for "
            f"revision {revision} ({type(error).__name__}: {short}): the hub no longer has it, "
            f"or {lock} comes from another hub; delete its entry for {repo} at {revision} to "
            "fetch the revision's current commit"
        )
    if "HfHubHTTPError" in names:
        return HubCacheError(
            f"the hub at {endpoint()} refused {repo} at revision {revision} "
            f"({type(error).__name__}: {short}): check the repo id and revision (and HF_TOKEN "
            "for a gated repo)"
        )
    return None


def fetch_model(
    repo: str,
    revision: str,
    target: str | Path,
    commit: str | None = None,
    lock: str | None = None,
    what: str = "",
) -> dict[str, Any]:
    """Fetch one model revision: config, tokenizer and weights (safetensors where the revision
    has them, else the PyTorch .bin files); ``commit``: the commit to fetch instead of what
    ``revision`` points to now (the lock file ``lock``'s). Returns the manifest; a hub not
    reached, or one that refuses the revision, raises ``HubCacheError`` in one line
    (``hub_fault``; ``what``: the config keys that need it, named there).
    """
    from huggingface_hub import HfApi

    target = check_fetch_folder(target, repo, revision)[2]
    try:
        info = HfApi().repo_info(repo, revision=commit or revision, files_metadata=True)
        names = [sibling.rfilename for sibling in info.siblings or []]
        weights = "*.safetensors" if any(n.endswith(".safetensors") for n in names) else "*.bin"
        return _download(repo, revision, "model", [*MODEL_FILES, weights], Path(target), info)
    except Exception as error:
        pinned = (commit, str(lock)) if commit else None
        fault = hub_fault(error, repo, revision, pinned, what, target if what else None)
        if fault is None:
            raise
        raise fault from None


def dataset_patterns(readme: str, config: str | None) -> list[str]:
    """The data files of one dataset config, from the ``configs:`` of a dataset card (read by
    huggingface_hub's card API); ``config`` None takes the default one.
    """
    from huggingface_hub import DatasetCard

    configs = getattr(DatasetCard(readme).data, "configs", None) or []
    if config is None:
        chosen = [c for c in configs if c.get("default")] or [
            c for c in configs if c.get("config_name") == "default"
        ]
    else:
        chosen = [c for c in configs if c.get("config_name") == config]
    if len(chosen) != 1:
        names = [c.get("config_name") for c in configs]
        raise HubCacheError(f"dataset card has no config {config or 'default'!r} (has {names})")
    data_files = chosen[0].get("data_files", [])
    if isinstance(data_files, str | dict):
        data_files = [data_files]
    patterns = []
    for entry in data_files:
        paths = entry["path"] if isinstance(entry, dict) else entry
        patterns += [paths] if isinstance(paths, str) else list(paths)
    return patterns


def fetch_dataset(
    repo: str,
    config: str | None,
    target: str | Path,
    revision: str = "main",
    commit: str | None = None,
    lock: str | None = None,
) -> dict[str, Any]:
    """Fetch the card and the data files of one dataset config (every split of it) at
    ``revision``, or at ``commit`` when given (the lock file's). Returns the manifest.
    """
    import tempfile

    from huggingface_hub import HfApi, hf_hub_download

    target = check_fetch_folder(target, repo, revision, ("datasets",))[2]
    try:
        info = HfApi().dataset_info(repo, revision=commit or revision, files_metadata=True)
        with tempfile.TemporaryDirectory() as folder:
            card = hf_hub_download(
                repo, "README.md", repo_type="dataset", revision=info.sha, local_dir=folder
            )
            readme = Path(card).read_text("utf-8")
        patterns = ["README.md", *dataset_patterns(readme, config)]
        return _download(repo, revision, "dataset", patterns, Path(target), info)
    except Exception as error:
        fault = hub_fault(error, repo, revision, (commit, str(lock)) if commit else None)
        if fault is None:
            raise
        raise fault from None


def write_manifest(manifest: dict[str, Any], path: str | Path) -> None:
    """Write a fetch's manifest as JSON, atomically."""
    write_text(path, json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def checkpoints_on_disk(cache_dir: str | Path) -> int:
    """How many checkpoint revision folders the cache holds now."""
    root = Path(cache_dir) / "checkpoints"
    folders = {path.parent for path in root.rglob("config.json")}
    return sum(1 for folder in folders if not folder.name.endswith(".partial"))


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


def damaged_files(folder: str | Path) -> list[str]:
    """The files of a fetched folder whose bytes differ from the hashes its manifest recorded
    at fetch time (the hub's own; a streaming hash of each); [] where it recorded none (a fetch
    from before hashes were recorded).
    """
    manifest = manifest_of(folder)
    if manifest is None:
        return []
    try:
        hashes = json.loads(manifest.read_text("utf-8")).get("hashes") or {}
    except (OSError, ValueError, AttributeError):
        return []
    return content.damaged(folder, hashes) if isinstance(hashes, dict) else []


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
    damaged = damaged_files(folder)
    if damaged:
        raise HubCacheError(
            f"{what}: {folder / damaged[0]} differs from the hash the hub gave it at fetch time "
            f"({len(damaged)} such files; {manifest_of(folder)}): the file is damaged or was "
            f"changed; fetch it again where the network is: {fix}"
        )
    return folder


@dataclass(frozen=True)
class Revision:
    """One hub model revision the config names and the (model, step) jobs that read it;
    ``checkpoint``: a revision_template step, deleted from the cache once those jobs are done.
    """

    repo: str
    revision: str
    checkpoint: bool
    consumers: tuple[tuple[str, str], ...]


def revision_of(entry: Any, step: str) -> tuple[str, str, bool] | None:
    """``(repo, revision, checkpoint)`` a ModelEntry reads at a step, None when not from the
    hub (``revision`` "main" when the source names none).
    """
    if entry.is_trained_here or "hub" not in entry.source:
        return None
    source = entry.source_at(step)
    return str(source["hub"]), str(source.get("revision") or "main"), step.isdigit()


def hub_revisions(models: dict[str, Any]) -> list[Revision]:
    """Every hub revision of ``models`` (ModelEntry by name), in config order of models, then
    steps; a revision read both as a checkpoint and as a fixed revision counts as a
    checkpoint.
    """
    found: dict[tuple[str, str], tuple[bool, list[tuple[str, str]]]] = {}
    for name, entry in models.items():
        for step in entry.steps:
            where = revision_of(entry, step)
            if where is None:
                continue
            checkpoint, consumers = found.setdefault(where[:2], (where[2], []))
            found[where[:2]] = (checkpoint or where[2], [*consumers, (name, step)])
    return [
        Revision(repo, revision, checkpoint, tuple(consumers))
        for (repo, revision), (checkpoint, consumers) in found.items()
    ]


def predecessor(revisions: list[Revision], revision: Revision, bound: int) -> Revision | None:
    """The checkpoint revision whose jobs must be done (and its folder deleted) before
    ``revision`` is fetched: the one ``bound`` places earlier among the checkpoint revisions.
    The checkpoints form ``bound`` lanes with one revision on disk each, so at most ``bound``
    sit in the cache at once.
    """
    order = [r for r in revisions if r.checkpoint]
    index = order.index(revision)
    return order[index - bound] if index >= bound else None
