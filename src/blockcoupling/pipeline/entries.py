"""Model entries: what each model of the config is (source, steps, twin, metadata), from
the config's ``models``, ``model_tables`` and trained runs.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from blockcoupling.files.combine import META_FIELDS
from blockcoupling.lm.models import LoadOptions
from blockcoupling.lm.training.schedule import TrainConfig
from blockcoupling.pipeline.errors import ConfigError

FINAL, RANDOM = "final", "random"


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
    token_families: bool = True  # False: depth-wise only (e.g. a long checkpoint suite)
    twin_of: str | None = None  # the model whose identical random-init twin stands for this one's
    twin_seed: int | None = None  # its twin's own seed (``random_init.per_run``), else the config's

    @property
    def measured_steps(self) -> tuple[str, ...]:
        """The steps this model's own jobs measure: all but a twin measured under ``twin_of``."""
        return tuple(s for s in self.steps if not (s == RANDOM and self.twin_of))

    @property
    def scored_steps(self) -> tuple[str, ...]:
        """The steps the evaluate rule scores: not the random twin (its bits per byte are chance
        by construction and no analysis reads them).
        """
        return tuple(s for s in self.steps if s != RANDOM)

    def measured_as(self, step: str) -> str:
        """The model whose files hold this model's ``step``."""
        return self.twin_of if step == RANDOM and self.twin_of else self.name

    @property
    def is_checkpoint_suite(self) -> bool:
        """Whether its steps are checkpoint numbers (not ``final``/``random``)."""
        return all(step.isdigit() for step in self.steps)

    @property
    def is_trained_here(self) -> bool:
        """Whether its weights come from a training run of this workflow."""
        return "train" in self.source

    def train_step(self, step: str) -> str:
        """The checkpoint of a trained run behind a step wildcard (``final``/``random``: last)."""
        return str(self.source["step"]) if self.source.get("checkpoint") == "last" else step

    def source_at(self, step: str) -> dict[str, Any]:
        """The source spec at a step: hub checkpoints get ``revision``, trained runs a ``path``."""
        if self.is_trained_here:
            return {"path": f"results/train/{self.source['train']}/step{self.train_step(step)}"}
        if step.isdigit() and "hub" in self.source:
            return {**self.source, "revision": self.revision_template.format(step=step)}
        return dict(self.source)


def _number(value: str | None) -> float | None:
    return float(value) if value not in ("", None) else None


# Optional model-table columns that become load options (models.LoadOptions); empty: default.
LOAD_COLUMNS = ("dtype", "quantization", "device_map")


def table_entries(path: str | Path, random_init: bool) -> dict[str, ModelEntry]:
    """Model entries from a TSV such as resources/paper_models.tsv (name, hub_id, metadata,
    gpu_mem_gb, and the load options of LOAD_COLUMNS); scores missing in the table stay missing.
    Resources per model: ``gpu_mem_gb`` (default 16), ``mem_mb`` (default 1.5 GB of host memory
    per GB of GPU memory, at least 16 GB) and ``runtime`` (minutes; default: the rule's), from
    columns of those names when present.
    """
    entries = {}
    with open(path, newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle, delimiter="\t"), start=2):
            try:
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
                load = {key: row[key] for key in LOAD_COLUMNS if row.get(key)}
                LoadOptions(**load)
                resources = {
                    "gpu_mem_gb": gpu,
                    "mem_mb": int(row.get("mem_mb") or max(16000, gpu * 1500)),
                    **({"runtime": int(row["runtime"])} if row.get("runtime") else {}),
                }
            except (KeyError, TypeError, ValueError) as error:
                raise ConfigError(f"model_table {path} line {line}: {error}") from None
            entries[row["name"]] = ModelEntry(
                name=row["name"],
                source={"hub": row["hub_id"]},
                steps=_default_steps(random_init),
                meta=meta,
                load=load,
                resources=resources,
            )
    return entries


def _default_steps(random_init: bool) -> tuple[str, ...]:
    """``final``, and ``random`` (the twin) when random-init twins are on."""
    return (FINAL, RANDOM) if random_init else (FINAL,)


def train_config(run: str, spec: dict[str, Any], key: str | None = None) -> TrainConfig:
    """The ``TrainConfig`` of a run, or a ConfigError naming ``key`` (default
    ``train.runs.<run>``) and the field.
    """
    key = key or f"train.runs.{run}"
    try:
        return TrainConfig(**spec)
    except TypeError as error:  # an unknown key
        raise ConfigError(f"{key}: {error}".replace("TrainConfig.__init__() ", "")) from None
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None


def model_entries(config: dict[str, Any]) -> dict[str, ModelEntry]:
    """All models of a config: the model table's rows, then ``models:`` (which may override)."""
    random_init = config.get("random_init", {}).get("enabled", True)
    per_run = config.get("random_init", {}).get("per_run", False)
    entries: dict[str, ModelEntry] = {}
    if config.get("model_table"):
        entries.update(table_entries(config["model_table"], random_init))
    runs = config.get("train", {}).get("runs", {})
    for name, spec in (config.get("models") or {}).items():
        source = dict(spec["source"])
        if "train" in source:
            if source["train"] not in runs:
                raise ConfigError(
                    f"models.{name}.source: training run {source['train']!r} is not under "
                    f"train.runs ({', '.join(runs) or 'none'})"
                )
            run_steps = train_config(source["train"], runs[source["train"]]).steps
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
            token_families=spec.get("token_families", True),
            twin_seed=(
                train_config(source["train"], runs[source["train"]]).seed
                if per_run and "train" in source
                else None
            ),
        )
    return _share_twins(entries, runs)


def _share_twins(entries: dict[str, ModelEntry], runs: dict[str, Any]) -> dict[str, ModelEntry]:
    """Final models of runs trained here whose random-init twins are byte-identical (equal
    ``TrainConfig.twin_key`` and twin seed) measure the twin once: every other one gets
    ``twin_of`` = the first of them by name (a grid of 20 runs at one size with one twin seed:
    1 twin, not 20; with ``random_init.per_run``, each run's seed: 20 independent twins).
    """
    first: dict[tuple, str] = {}
    for name in sorted(entries):
        entry = entries[name]
        if not (entry.is_trained_here and RANDOM in entry.steps):
            continue
        key = train_config(entry.source["train"], runs[entry.source["train"]]).twin_key()
        key = (*key, entry.twin_seed)
        if key in first:
            entries[name] = replace(entry, twin_of=first[key])
        else:
            first[key] = name
    return entries
