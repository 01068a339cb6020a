"""Prompt sets: the six Open LLM Leaderboard task styles, from local files or the datasets hub,
and passages of held-out Shakespeare (source ``shakespeare``, ``heldout_prompts``).

A prompt is `{id, source, text, choices, answer}`. Multiple-choice prompts carry `choices`
(the continuations of `text`) and `answer`, the 0-based index of the correct choice; free-answer
prompts (gsm8k) have no `choices` and `answer` is the final number as a string. Winogrande texts
keep the `_` blank that a choice fills.
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockcoupling.files.io import read_utf8, write_text
from blockcoupling.lm import hub
from blockcoupling.lm.text import corpus


@dataclass(frozen=True)
class Prompt:
    """One prompt; `choices is None` for free-answer prompts."""

    id: str
    source: str
    text: str
    choices: tuple[str, ...] | None = None
    answer: str | int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; `choices` and `answer` are left out when None."""
        out: dict[str, Any] = {"id": self.id, "source": self.source, "text": self.text}
        if self.choices is not None:
            out["choices"] = list(self.choices)
        if self.answer is not None:
            out["answer"] = self.answer
        return out


# --- row converters for the hub datasets: row -> (text, choices, answer) ------------------


def _arc_row(row: Mapping[str, Any]) -> tuple[str, list[str], int]:
    labels = list(row["choices"]["label"])
    return row["question"], list(row["choices"]["text"]), labels.index(row["answerKey"])


def _gsm8k_row(row: Mapping[str, Any]) -> tuple[str, None, str]:
    final = row["answer"].split("####")[-1].strip().replace(",", "")
    return row["question"], None, final


def _hellaswag_row(row: Mapping[str, Any]) -> tuple[str, list[str], int]:
    def clean(text: str) -> str:  # WikiHow markup, as in the leaderboard's preprocessing
        text = re.sub(r"\[.*?\]", "", text.strip().replace(" [title]", ". "))
        return text.replace("  ", " ").strip()

    return clean(row["ctx"]), [clean(e) for e in row["endings"]], int(row["label"])


def _mmlu_row(row: Mapping[str, Any]) -> tuple[str, list[str], int]:
    return row["question"], list(row["choices"]), int(row["answer"])


def _truthfulqa_row(row: Mapping[str, Any]) -> tuple[str, list[str], int]:
    targets = row["mc1_targets"]  # exactly one label is 1
    return row["question"], list(targets["choices"]), list(targets["labels"]).index(1)


def _winogrande_row(row: Mapping[str, Any]) -> tuple[str, list[str], int]:
    return row["sentence"], [row["option1"], row["option2"]], int(row["answer"]) - 1


# The full suite. The paper samples test splits; where a test split has no labels (HellaSwag,
# Winogrande) or does not exist (TruthfulQA), the validation split is used instead.
SOURCES: dict[str, dict[str, Any]] = {
    "arc": {
        "hub": "allenai/ai2_arc",
        "config": "ARC-Challenge",
        "split": "test",
        "convert": _arc_row,
    },
    "gsm8k": {"hub": "openai/gsm8k", "config": "main", "split": "test", "convert": _gsm8k_row},
    # HellaSwag test labels are hidden (empty): use validation.
    "hellaswag": {
        "hub": "Rowan/hellaswag",
        "config": None,
        "split": "validation",
        "convert": _hellaswag_row,
    },
    "mmlu": {"hub": "cais/mmlu", "config": "all", "split": "test", "convert": _mmlu_row},
    # TruthfulQA has only a validation split.
    "truthfulqa": {
        "hub": "truthfulqa/truthful_qa",
        "config": "multiple_choice",
        "split": "validation",
        "convert": _truthfulqa_row,
    },
    # Winogrande test labels are empty: use validation.
    "winogrande": {
        "hub": "allenai/winogrande",
        "config": "winogrande_xl",
        "split": "validation",
        "convert": _winogrande_row,
    },
}


# --- building and validating prompts ----------------------------------------------------------


def _field(row: Mapping[str, Any], key: str, default: str) -> str:
    """`row[key]` as a stripped string, or `default` when absent or blank."""
    value = row.get(key)
    return default if value is None or not str(value).strip() else str(value).strip()


def _make_prompt(
    row: Mapping[str, Any], where: str, default_id: str, default_source: str
) -> Prompt:
    """Validate one row (`where` names it in errors) and build a Prompt."""
    source = _field(row, "source", default_source)
    pid = _field(row, "id", default_id)
    text = row.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where} (id {pid!r}): empty or missing text")
    choices = row.get("choices")
    if isinstance(choices, str):  # CSV cells hold a JSON list
        try:
            choices = json.loads(choices)
        except json.JSONDecodeError:
            raise ValueError(
                f"{where} (id {pid!r}): choices must be a JSON list, got {choices!r}"
            ) from None
    if choices is not None:
        if (
            not isinstance(choices, list | tuple)
            or len(choices) < 2
            or not all(isinstance(c, str) for c in choices)
        ):
            raise ValueError(f"{where} (id {pid!r}): choices must be a list of at least 2 strings")
        choices = tuple(choices)
    answer = row.get("answer")
    if answer is not None and choices is not None:
        try:
            answer = int(answer)
        except (TypeError, ValueError):
            raise ValueError(
                f"{where} (id {pid!r}): answer must be a choice index, got {answer!r}"
            ) from None
        if not 0 <= answer < len(choices):
            raise ValueError(
                f"{where} (id {pid!r}): answer {answer} out of range for {len(choices)} choices"
            )
    elif answer is not None:
        answer = str(answer)
    return Prompt(id=pid, source=source, text=text.strip(), choices=choices, answer=answer)


def _check_unique(prompts: list[Prompt], path: Path) -> list[Prompt]:
    seen: set[str] = set()
    for p in prompts:
        if p.id in seen:
            raise ValueError(f"{path}: duplicate prompt id {p.id!r}")
        seen.add(p.id)
    return prompts


def _read_text(path: str | os.PathLike) -> tuple[Path, str]:
    """A prompt file's text, or one error naming the file: missing, empty or not UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file not found: {path}")
    text = read_utf8(path)
    if not text.strip():
        raise ValueError(f"prompt file is empty: {path}")
    return path, text


def load_prompt_file(path: str | os.PathLike, source: str | None = None) -> list[Prompt]:
    """Read prompts from a local `.jsonl` or `.csv` file.

    Column `text` is required; `id`, `source`, `choices` (in CSV: a JSON list) and `answer` are
    optional. A missing source defaults to `source` or the file stem; a missing id to
    `f"{source}-{i:04d}"` with i the 1-based line (JSONL) or row (CSV) number. Errors name the
    file and the 1-based line or row.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise ValueError(f"prompt file must be .jsonl or .csv, got {path.name}")
    if suffix == ".jsonl":
        return read_jsonl(path, source)
    path, text = _read_text(path)
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise ValueError(f"prompt file has a header but no rows: {path}")
    if "text" not in rows[0]:
        raise ValueError(f"{path}: missing required column 'text' (columns: {list(rows[0])})")
    default_source = source or path.stem
    prompts = []
    for i, cells in enumerate(rows, start=1):
        row = {key: value for key, value in cells.items() if value not in ("", None)}
        src = _field(row, "source", default_source)
        prompts.append(_make_prompt(row, f"{path} row {i}", f"{src}-{i:04d}", default_source))
    return _check_unique(prompts, path)


def load_hub_prompts(
    source: str,
    n: int,
    seed: int,
    folder: str | os.PathLike | None = None,
    revision: str | None = None,
) -> list[Prompt]:
    """Sample `n` prompts (all if fewer) of one SOURCES entry from the datasets hub at
    `revision` (a branch, tag or commit; None: main), or from `folder`, its copy fetched into
    the hub cache (`lm.hub.fetch_dataset`, at its pinned commit; read offline).

    Rows are drawn without replacement by a seeded RNG; ids are `f"{source}-{row:04d}"` with
    the 0-based row index in the split, so a row keeps its id whatever the seed or n.
    """
    import datasets
    import numpy as np

    if source not in SOURCES:
        raise ValueError(f"unknown prompt source {source!r}; choose from {sorted(SOURCES)}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    spec = SOURCES[source]
    where = spec["hub"]
    if folder is not None:
        where = str(hub.require(folder, f"prompt source {source} (dataset {spec['hub']})"))
    pinned = {"revision": revision} if folder is None and revision else {}
    table = datasets.load_dataset(where, spec["config"], split=spec["split"], **pinned)
    rows = np.sort(np.random.default_rng(seed).permutation(len(table))[:n])
    prompts = []
    for r in rows.tolist():
        text, choices, answer = spec["convert"](table[r])
        record = {"text": text, "choices": choices, "answer": answer}
        prompts.append(_make_prompt(record, f"{spec['hub']} row {r}", f"{source}-{r:04d}", source))
    return prompts


HELDOUT_SOURCE = "shakespeare"


def _line_start(text: str, at: int) -> int:
    """The first line start of ``text`` at or after ``at`` (``len(text)`` when there is none)."""
    if at <= 0:
        return 0
    end = text.find("\n", at - 1)
    return len(text) if end < 0 else end + 1


def heldout_prompts(skip_chars: int, chars: int = 200, split_seed: int = 0) -> list[Prompt]:
    """Every passage of the held-out (validation) plays after their first ``skip_chars``
    characters, as free-text prompts of source ``shakespeare``.

    ``skip_chars``: the text that bits per byte scores (``evaluate.heldout_chars``), so no prompt
    overlaps it; never training text (the plays of ``corpus.split_plays(split_seed)``'s
    validation side, the same split as the models trained here). Passages start at a line start
    and run to the first line end at or after ``chars`` characters (the shorter tail of the text
    is left out). Ids
    are ``shakespeare-<offset>``, the passage's character offset in the validation text, so a
    passage keeps its id whatever else is sampled.
    """
    if skip_chars < 0 or chars < 1:
        raise ValueError(f"need skip_chars >= 0 and chars >= 1, got {skip_chars}, {chars}")
    text = corpus.validation_text(split_seed)
    start = _line_start(text, skip_chars)
    out = []
    while start < len(text):
        end = _line_start(text, start + chars)
        passage = text[start:end].strip()
        if end - start >= chars and passage:  # not the short tail
            out.append(Prompt(f"{HELDOUT_SOURCE}-{start:07d}", HELDOUT_SOURCE, passage))
        start = end
    return out


def sample_prompts(prompts: Iterable[Prompt], n_per_source: int, seed: int) -> list[Prompt]:
    """Seeded stratified sample: `n_per_source` prompts of every source (all if it has fewer).

    Each source is sampled with its own RNG seeded by `(seed, source)`, so adding a source does
    not change the others. Output is ordered by source, then id.
    """
    if n_per_source < 1:
        raise ValueError(f"n_per_source must be >= 1, got {n_per_source}")
    by_source: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_source.setdefault(p.source, []).append(p)
    out: list[Prompt] = []
    for source in sorted(by_source):
        group = sorted(by_source[source], key=lambda p: p.id)
        if len(group) > n_per_source:
            group = sorted(
                random.Random(f"{seed}-{source}").sample(group, n_per_source), key=lambda p: p.id
            )
        out.extend(group)
    return out


def merge_sources(*samples: list[Prompt]) -> list[Prompt]:
    """Samples of disjoint sources as one list, ordered by source, then id (as
    ``sample_prompts`` orders); a source in two samples is refused.
    """
    sources = [{p.source for p in sample} for sample in samples]
    if sum(map(len, sources)) != len(set().union(*sources)):
        raise ValueError("merge_sources: a source appears in more than one sample")
    return sorted((p for sample in samples for p in sample), key=lambda p: (p.source, p.id))


def provenance(
    manifests: Mapping[str, str | os.PathLike], file: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Where a prompt set's text comes from: per hub source (``manifests``: source -> the
    manifest of its fetch) the dataset repo, config, split, revision asked and commit fetched
    with its files; for a local prompt file its path and SHA-256.
    """
    import hashlib

    found: dict[str, Any] = {"hub": {}}
    for source, path in manifests.items():
        manifest = json.loads(Path(path).read_text("utf-8"))
        found["hub"][source] = {
            "repo": manifest["repo"],
            "config": SOURCES[source]["config"],
            "split": SOURCES[source]["split"],
            "revision": manifest["revision"],
            "commit": manifest["commit"],
            "files": manifest["files"],
        }
    if file is not None:
        digest = hashlib.sha256(Path(file).read_bytes()).hexdigest()
        found["file"] = {"path": str(file), "sha256": digest}
    return found


def write_jsonl(prompts: Iterable[Prompt], path: str | os.PathLike) -> None:
    """Write prompts as JSON lines, atomically (``io.write_text``)."""
    write_text(path, "".join(json.dumps(p.to_dict(), ensure_ascii=False) + "\n" for p in prompts))


def read_jsonl(path: str | os.PathLike, source: str | None = None) -> list[Prompt]:
    """Read prompts from JSON lines (as written by `write_jsonl`, exact types); blank lines are
    skipped; errors name the file and the 1-based line.
    """
    path, text = _read_text(path)
    default_source = source or path.stem
    prompts = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {i}: invalid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {i}: expected a JSON object")
        src = _field(row, "source", default_source)
        prompts.append(_make_prompt(row, f"{path} line {i}", f"{src}-{i:04d}", default_source))
    return _check_unique(prompts, path)
