"""Hub repo ids and revisions as the Hugging Face hub accepts them, and paths kept inside their
folder: a name that becomes a folder (``hub_cache/models/<repo>/<revision>``) or a file inside
a package can never point outside it (``..``, absolute paths, symlinks out).
"""

from __future__ import annotations

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
