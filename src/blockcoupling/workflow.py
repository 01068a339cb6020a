"""What the Snakemake rules share: model entries from the config, step wildcards, code hashes,
and the wrapper that runs a rule's script with its log, threads and one-line errors.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import logging
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FINAL, RANDOM = "final", "random"
TRAINED_INITS = {FINAL: "trained", RANDOM: "random"}
META_FIELDS = (
    "params",
    "n_layers",
    "d_model",
    "train_tokens",
    "score",
    "base",
    "family",
    "pos_encoding",
)


@dataclass(frozen=True)
class ModelEntry:
    """One configured model: its source spec, the step wildcards it runs at, metadata, resources."""

    name: str
    source: dict[str, Any]
    steps: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    revision_template: str = "step{step}"

    @property
    def is_checkpoint_suite(self) -> bool:
        return all(step.isdigit() for step in self.steps)

    def train_step(self, step: str) -> str:
        """The checkpoint of a trained run behind a step wildcard (``final``/``random``: the last)."""
        return str(self.source["step"]) if self.source.get("checkpoint") == "last" else step

    def source_at(self, step: str) -> dict[str, Any]:
        """The source spec at a step: hub checkpoints get ``revision``, trained runs a ``path``."""
        if "train" in self.source:
            return {"path": f"results/train/{self.source['train']}/step{self.train_step(step)}"}
        if step.isdigit() and "hub" in self.source:
            return {**self.source, "revision": self.revision_template.format(step=step)}
        return dict(self.source)


def _number(value: str) -> float | None:
    return float(value) if value not in ("", None) else None


def table_entries(path: str | Path, random_init: bool) -> dict[str, ModelEntry]:
    """Model entries from a TSV such as resources/paper_models.tsv (name, hub_id, metadata,
    gpu_mem_gb); scores missing in the table stay missing.
    """
    entries = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            meta = {
                "params": _number(row["params"]),
                "n_layers": int(row["n_layers"]),
                "d_model": int(row["d_model"]),
                "train_tokens": _number(row.get("train_tokens", "")),
                "score": _number(row.get("score", "")),
                "base": row.get("base", "").strip().lower() == "true",
                "family": row.get("family", ""),
                "pos_encoding": row.get("pos_encoding", ""),
            }
            gpu = int(float(row.get("gpu_mem_gb") or 16))
            entries[row["name"]] = ModelEntry(
                name=row["name"],
                source={"hub": row["hub_id"]},
                steps=_default_steps(random_init),
                meta=meta,
                resources={"gpu_mem_gb": gpu, "mem_mb": max(16000, gpu * 1500)},
            )
    return entries


def _default_steps(random_init: bool) -> tuple[str, ...]:
    """``final``, and ``random`` (the twin) when random-init twins are on."""
    return (FINAL, RANDOM) if random_init else (FINAL,)


def train_steps(train_spec: dict[str, Any]) -> list[int]:
    """Checkpoint steps of a training run (the TrainConfig's schedule)."""
    from blockcoupling.schedule import TrainConfig

    return TrainConfig(**train_spec).steps


def model_entries(config: dict[str, Any]) -> dict[str, ModelEntry]:
    """All models of a config: the model table's rows, then ``models:`` (which may override them)."""
    random_init = config.get("random_init", {}).get("enabled", True)
    entries: dict[str, ModelEntry] = {}
    if config.get("model_table"):
        entries.update(table_entries(config["model_table"], random_init))
    for name, spec in (config.get("models") or {}).items():
        source = dict(spec["source"])
        if "train" in source:
            runs = config.get("train", {}).get("runs", {})
            if source["train"] not in runs:
                raise ValueError(
                    f"model {name!r}: training run {source['train']!r} is not under train.runs"
                )
            run_steps = train_steps(runs[source["train"]])
            if source.get("checkpoint") == "last":  # one model of the cross-model analysis
                source["step"] = run_steps[-1]
                steps = _default_steps(spec.get("random_init", random_init))
            else:
                steps = tuple(str(s) for s in run_steps)
        elif spec.get("steps"):
            steps = tuple(str(int(s)) for s in spec["steps"])
        else:
            steps = _default_steps(spec.get("random_init", random_init))
        entries[name] = ModelEntry(
            name=name,
            source=source,
            steps=steps,
            meta={key: spec.get("meta", {}).get(key) for key in META_FIELDS},
            load=dict(spec.get("load", {})),
            resources=dict(spec.get("resources", {})),
            revision_template=spec.get("revision_template", "step{step}"),
        )
    return entries


def code_hash(*modules: str) -> str:
    """sha256 (12 hex digits) of the source files of library modules, e.g. ``code_hash('jacobians')``.
    A rule that takes it as a param re-runs when that science code changes (Snakemake's own code
    trigger only sees the script file).
    """
    digest = hashlib.sha256()
    for module in modules:
        spec = importlib.util.find_spec(f"blockcoupling.{module}")
        if spec is None or spec.origin is None:
            raise ValueError(f"no module blockcoupling.{module}")
        digest.update(Path(spec.origin).read_bytes())
    return digest.hexdigest()[:12]


USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)


def run_script(snakemake: Any, main: Callable[[Any], None]) -> None:
    """Run a rule's ``main(snakemake)`` with logging to the rule's log and stderr, torch threads
    set to the rule's threads, and a user error reduced to one line (exit status 1).
    """
    log_path = Path(snakemake.log[0]) if len(snakemake.log) else None
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        handlers=handlers,
        force=True,
    )
    import torch

    torch.set_num_threads(max(1, int(snakemake.threads)))
    try:
        main(snakemake)
    except USER_ERRORS as error:
        logging.error("%s: %s", snakemake.rule, error)
        if log_path is not None:  # the traceback stays in the log, the console gets one line
            with open(log_path, "a") as log:
                traceback.print_exc(file=log)
        sys.exit(1)


SELECTION_DEFAULTS = {"k": 10, "reading": "authors", "variant": "ujv", "norm": "p"}


def selection(stats_config: dict[str, Any], with_k: bool = True) -> dict[str, Any]:
    """The (k,) reading, variant and norm at which statistics and figures are reported."""
    chosen = {key: stats_config.get(key, default) for key, default in SELECTION_DEFAULTS.items()}
    if not with_k:
        chosen.pop("k")
    return chosen


def load_for_rule(spec: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """Load a rule's model from ``model_params`` (source, load options, twin): ``(model,
    tokenizer, attrs)`` with the provenance attrs of its files.
    """
    from blockcoupling.models import LoadOptions, load_model, load_random_twin, parse_source

    source = parse_source(spec["source"])
    options = LoadOptions(**spec.get("load", {}))
    if spec.get("random_twin"):
        logging.info(
            "random-init twin of %s (%s), seed %s",
            spec["name"],
            source.describe(),
            spec.get("twin_seed", 0),
        )
        model, tokenizer = load_random_twin(source, spec.get("twin_seed", 0), options)
    else:
        logging.info("loading %s (%s)", spec["name"], source.describe())
        model, tokenizer = load_model(source, options)
    attrs = {
        "model": spec["name"],
        "model_id": source.location,
        "revision": source.revision,
        "source": source.describe(),
        "init": "random" if spec.get("random_twin") else "trained",
        "twin_seed": spec.get("twin_seed", 0) if spec.get("random_twin") else None,
        "dtype": options.dtype,
        "device": options.device,
        "quantization": options.quantization,
    }
    return model, tokenizer, attrs
