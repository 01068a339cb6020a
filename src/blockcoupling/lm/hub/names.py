"""Hub repo ids and revisions as the Hugging Face hub accepts them, and paths kept inside their
folder: a name that becomes a folder (``hub_cache/models/<repo>/<revision>``) or a file inside
a package can never point outside it (``..``, absolute paths, symlinks out).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# git check-ref-format: no control characters, space, ~ ^ : ? * [ \ or "@{"; no component that
# starts with "." or ends with ".lock"; no "..", "//", leading or trailing "/"; not "@".
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|@\{|\.\.|//")


class HubNameError(ValueError):
    """A repo id or revision the hub would refuse, or a path outside its folder."""


def check_repo_id(repo: str) -> str:
    """``repo`` if the hub accepts it as a model or dataset id (``huggingface_hub``'s own
    ``validate_repo_id``: ``name`` or ``org/name``, no ``..`` or ``--``), else HubNameError.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError:
        raise HubNameError(
            f"hub id {repo!r} is not a Hugging Face repo id (name or org/name: letters, digits, "
            "'-', '_', '.', no '..' or '--', not starting or ending with '-' or '.')"
        ) from None
    return repo


def check_revision(revision: str) -> str:
    """``revision`` if it is a git ref name or commit the hub accepts (git check-ref-format:
    e.g. ``main``, ``step1000``, ``refs/pr/1``, a commit hash), else HubNameError.
    """
    parts = revision.split("/")
    if (
        not revision
        or revision == "@"
        or _REF_FORBIDDEN.search(revision)
        or revision.endswith(".")
        or any(not part or part.startswith(".") or part.endswith(".lock") for part in parts)
    ):
        raise HubNameError(
            f"hub revision {revision!r} is not a git branch, tag or commit name (no '..', no "
            "part starting with '.', no leading or trailing '/', no spaces or ~^:?*[\\)"
        )
    return revision


def contained(path: str | Path, folder: str | Path, what: str) -> Path:
    """``path`` (relative to ``folder`` when not absolute), resolved, if it lies inside
    ``folder`` (symlinks followed), else HubNameError naming ``what``.
    """
    root = Path(folder).resolve()
    resolved = (root / path).resolve()
    if not resolved.is_relative_to(root):
        raise HubNameError(f"{what} {str(path)!r} leads outside {root}; name a file inside it")
    return resolved


# The top folders of the hub cache that hold fetched revisions, and the kind of each.
CACHE_KINDS = {"models": "model", "checkpoints": "checkpoint", "datasets": "dataset"}


def check_fetch_folder(
    folder: str | Path, repo: str, revision: str, tops: tuple[str, ...] = ("models", "checkpoints")
) -> tuple[Path, str, Path]:
    """``(cache_dir, kind, resolved folder)`` of ``folder`` if it is the revision folder of
    ``repo`` at ``revision`` in a hub cache (``CACHE_DIR/<top>/<repo>/<revision>``, ``top`` one
    of ``tops``), the id and revision ones the hub accepts, and no part of it below
    ``CACHE_DIR/<top>`` a symlink (a fetch replaces exactly that folder: it deletes nothing
    outside it); else HubNameError. Used by the workflow's fetch rules and ``blockcoupling
    fetch`` alike.
    """
    check_repo_id(repo)
    check_revision(revision)
    if "/" in revision:
        raise HubNameError(
            f"hub revision {revision!r} has '/': the hub cache keeps a revision as one folder; "
            "give its commit hash"
        )
    parts = Path(folder).parts
    tail = (*repo.split("/"), revision)
    top = len(parts) - len(tail) - 1
    if top < 0 or tuple(parts[top + 1 :]) != tail or parts[top] not in tops:
        expected = " or ".join(f"HUB_CACHE/{name}/{repo}/{revision}" for name in tops)
        raise HubNameError(
            f"{folder}: not the folder of {repo} at {revision} in a hub cache (expected {expected})"
        )
    cache = Path(*parts[:top]) if top else Path(".")
    return cache, CACHE_KINDS[parts[top]], owned(folder, cache / parts[top])


def owned(folder: str | Path, root: str | Path) -> Path:
    """``folder`` (a path below ``root``) resolved, if no part of it below ``root`` is a symlink
    and none is ``..``: what deleting it deletes lies inside ``root`` (itself resolved); else
    HubNameError naming the link.
    """
    relative = Path(folder).relative_to(root)
    if any(part in ("..", ".") for part in relative.parts):
        raise HubNameError(f"{folder}: has '..'; name the folder itself")
    path = Path(root).resolve()
    for part in relative.parts:
        path = path / part
        if path.is_symlink():
            raise HubNameError(
                f"{folder}: {path} is a symlink (to {os.readlink(path)}); the fetch replaces "
                f"this folder and deletes nothing outside {Path(root).resolve()}: remove the "
                "link (rm, not rm -r) and fetch again"
            )
    return path
