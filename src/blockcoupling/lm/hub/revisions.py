"""The hub revisions a config names: which (model, step) jobs read each, and the order in
which fetches may run when the cache may hold only so many (``hub.max_revisions``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
