"""Fetching from the hub, where the network is (the login node): model revisions and prompt
datasets into plain folders of the shared cache that compute jobs read offline
(``hub_cache`` reads them back and checks them), each with its manifest; the commit each fetch
resolved goes into the lock file (``lockfile``, ``lock_file``), which later fetches follow.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from blockcoupling.lm.hub import content
from blockcoupling.lm.hub.cache import (
    HubCacheError,
    damaged_files,
    fetch_command,
    missing_files,
    unhashed_files,
    write_manifest,
)
from blockcoupling.lm.hub.names import check_fetch_folder

# What loading a causal LM needs besides its weights: config, generation config, tokenizer
# (tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab/merges, sentencepiece).
MODEL_FILES = ("*.json", "*.txt", "*.model", "*.tiktoken")
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


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
    repo: str,
    revision: str,
    repo_type: str,
    patterns: list[str],
    target: Path,
    info: Any,
    manifest: Path | None = None,
) -> dict[str, Any]:
    """Fetch the files of ``info`` (the repo info at ``revision``, with files metadata) that
    match ``patterns`` into ``target``; returns its manifest, also written to ``manifest`` when
    given. Safe under concurrency: one lock per revision folder (``.<name>.lock`` beside it);
    the download goes into a private temporary folder beside it, is checked against the hub's
    list (every file the hub lists, of its size and hash; the manifest lists exactly those,
    never what happens to be on disk), then renamed into place. A fetcher that waited on the
    lock finds the folder its predecessor completed and keeps it.
    """
    from filelock import FileLock
    from huggingface_hub.utils import filter_repo_objects

    listed = {sibling.rfilename: sibling for sibling in info.siblings or []}
    names = sorted(filter_repo_objects(list(listed), allow_patterns=patterns))
    if not names:
        raise HubCacheError(f"{repo}@{revision}: no file matches {patterns}")
    files = {name: listed[name].size for name in names}
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{target.name}.lock"):
        if manifest is not None and _complete(target, manifest, info.sha, files):
            return json.loads(manifest.read_text("utf-8"))
        for stale in target.parent.glob(f".{target.name}.partial-*"):  # of a killed fetch
            _remove(stale)
        private = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        mask = os.umask(0)
        os.umask(mask)
        private.chmod(0o777 & ~mask)  # the umask's, as a folder made by mkdir (mkdtemp's: 0700)
        try:
            hashes = _fill(private, repo, revision, repo_type, names, files, info)
            _remove(target)
            private.rename(target)
        finally:
            _remove(private)
        fetched = {
            "repo": repo,
            "repo_type": repo_type,
            "revision": revision,
            "commit": info.sha,
            "files": files,
            "hashes": hashes,
            "bytes": sum(files.values()),
            "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if manifest is not None:
            write_manifest(fetched, manifest)
        return fetched


def _fill(
    folder: Path,
    repo: str,
    revision: str,
    repo_type: str,
    names: list[str],
    files: dict[str, int],
    info: Any,
) -> dict[str, str]:
    """Download ``names`` of ``repo`` at ``info.sha`` into ``folder`` (private to this fetch)
    and check it holds exactly those files, of the hub's sizes and hashes; returns the hashes.
    """
    from huggingface_hub import snapshot_download

    snapshot_download(
        repo, repo_type=repo_type, revision=info.sha, allow_patterns=names, local_dir=folder
    )
    shutil.rmtree(folder / ".cache", ignore_errors=True)  # huggingface_hub's download state
    on_disk = {str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir()}
    sized = {n for n in on_disk & set(names) if (folder / n).stat().st_size != files[n]}
    wrong = sorted((set(names) ^ on_disk) | sized)
    if wrong:
        raise HubCacheError(
            f"{repo}@{revision}: the download differs from the hub's list of files at "
            f"{info.sha} (e.g. {wrong[0]} missing, extra or of another size; {len(wrong)} such "
            "files): fetch again"
        )
    hashes, differing = content.fetched_hashes(folder, names, info.siblings)
    if differing:
        raise HubCacheError(
            f"{repo}@{revision}: {differing[0]} as downloaded differs from the hash the hub gives "
            f"it ({len(differing)} such files): a damaged download or a proxy that changes "
            "files; fetch again"
        )
    return hashes


def _complete(target: Path, manifest: Path, commit: str, files: dict[str, int]) -> bool:
    """Whether ``target`` holds, by its ``manifest``, exactly ``files`` at ``commit``, each of
    the hash recorded for it (a fetch finished while this one waited for the lock).
    """
    try:
        fetched = json.loads(manifest.read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(fetched, dict)
        and fetched.get("commit") == commit
        and fetched.get("files") == files
        and missing_files(target) == []
        and not unhashed_files(target)
        and damaged_files(target) == []
    )


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
    if "JSONDecodeError" in names:  # an answer, but not the hub API's JSON (a web page, say)
        return HubCacheError(
            f"the hub endpoint {endpoint()} answered the API call for {repo} at revision "
            f"{revision} with something that is not JSON ({short}; an HTML page?): set "
            "HF_ENDPOINT to a Hugging Face hub's address (unset: huggingface.co), then rerun"
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
    manifest: str | Path | None = None,
) -> dict[str, Any]:
    """Fetch one model revision: config, tokenizer and weights (safetensors where the revision
    has them, else the PyTorch .bin files); ``commit``: the commit to fetch instead of what
    ``revision`` points to now (the lock file ``lock``'s). Returns the manifest (also written
    to ``manifest``, under the folder's lock, when given); a hub not
    reached, or one that refuses the revision, raises ``HubCacheError`` in one line
    (``hub_fault``; ``what``: the config keys that need it, named there).
    """
    from huggingface_hub import HfApi

    target = check_fetch_folder(target, repo, revision)[2]
    try:
        info = HfApi().repo_info(repo, revision=commit or revision, files_metadata=True)
        names = [sibling.rfilename for sibling in info.siblings or []]
        weights = "*.safetensors" if any(n.endswith(".safetensors") for n in names) else "*.bin"
        patterns = [*MODEL_FILES, weights]
        written = Path(manifest) if manifest is not None else None
        return _download(repo, revision, "model", patterns, Path(target), info, written)
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
    manifest: str | Path | None = None,
) -> dict[str, Any]:
    """Fetch the card and the data files of one dataset config (every split of it) at
    ``revision``, or at ``commit`` when given (the lock file's). Returns the manifest (also
    written to ``manifest``, under the folder's lock, when given).
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
        written = Path(manifest) if manifest is not None else None
        return _download(repo, revision, "dataset", patterns, Path(target), info, written)
    except Exception as error:
        fault = hub_fault(error, repo, revision, (commit, str(lock)) if commit else None)
        if fault is None:
            raise
        raise fault from None
