"""The checked plan: every value the rules read, derived once from the config."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from blockcoupling.jacobians.options import ExtractConfig, runs_on_gpu
from blockcoupling.lm.hub import (
    Revision,
    hub_revisions,
    incomplete,
    missing_files,
    predecessor,
    revision_of,
)
from blockcoupling.lm.text.prompts import SOURCES
from blockcoupling.pipeline.entries import ModelEntry, train_config
from blockcoupling.pipeline.hub_settings import HubSettings
from blockcoupling.pipeline.vit_plan import ViTPlan, vit_folder
from blockcoupling.stats.selection import Bootstrap, Selection

if TYPE_CHECKING:  # the metrics module loads xarray: the DAG needs only the checked object
    from blockcoupling.coupling.metrics import MetricConfig

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
    """What the rules read: the checked config, resolved (``checks.check_config`` builds it
    once; every derived value is a field set there or computed from fields).
    """

    models: dict[str, ModelEntry]
    prompt_files: dict[str, str]  # prompt set -> resolved local file ('' for hub sets)
    selection: Selection  # k, reading, variant, norm of statistics and figures
    token_model: str | None  # the model of the per-model figures
    n_prompts: int  # prompts of the extraction set (hub sets: the most they can hold)
    vit: ViTPlan | None  # the ViT sweep, when enabled
    extraction: ExtractConfig  # the checked extract section
    metric: MetricConfig  # the checked metrics section
    hub: HubSettings  # the checked hub section (``max_revisions: all`` -> None: all ahead)
    extract: dict[str, Any]  # the checked ``extract`` section (a rule param, through
    # extract_options: ``measure`` is its typed form)
    job_threads: dict[str, int]  # section (extract, train, vit) -> threads of its jobs
    twin_seed: int  # the seed of every random-init twin (``random_init.seed``)
    train_runs: dict[str, dict[str, Any]]  # training runs: name -> TrainConfig fields
    grid_families: list[str]  # the family of every training grid (its name where it names none)
    prompt_set: str  # the prompt set that extraction and evaluation read
    prompt_sets: dict[str, dict[str, Any]]  # ``prompts.sets``: set -> its sources
    prompt_revisions: dict[str, str]  # ``prompts.revisions``: hub dataset -> pinned revision
    prompt_sampling: tuple[int, int]  # prompts per hub source, sampling seed
    passage_chars: int  # characters of each held-out passage prompt
    evaluate: bool  # whether the evaluate rule runs (bits per byte, multiple-choice accuracy)
    score: str  # the generalization score of the cross-model statistics (``evaluate.score``)
    heldout_chars: int  # characters of the held-out plays that evaluation reads
    context_length: int | None  # tokens per evaluation window (None: the model's own)
    bootstrap: Bootstrap  # the statistics' percentile bootstrap (``stats.n_boot``, ``seed``)
    primary: dict[str, Any]  # ``stats.primary``: test id -> declared effect and source
    peak_step: int | None  # the emergence design's declared peak step (``stats.peak_step``)
    within_window: list[int] | None  # the arms test's declared window (``stats.within_window``)
    power_file: str  # the pilot power table of the primary tests (``stats.power_file``)
    # model -> prompts per shard sized to its Slurm partition's time limit
    # (slurm_sizing.fit_shards); it replaces the configured prompts_per_shard where set
    shard_sizes: dict[str, int] = field(default_factory=dict)
    max_output_gb: float | None = None  # ``budget.max_output_gb``: the most output (None: any)
    primary_units: dict[str, int] = field(default_factory=dict)  # test id -> its design's units

    # ------------------------------------------------------------------ what the rules read
    @cached_property
    def hub_revisions(self) -> dict[tuple[str, str], Revision]:
        """Every hub revision the models read: (repo, revision) -> its Revision."""
        return {(r.repo, r.revision): r for r in hub_revisions(self.models)}

    def hub_folder(self, model: str, step: str) -> str | None:
        """The hub-cache folder a model reads at a step (None when not from the hub)."""
        where = revision_of(self.models[model], step)
        if where is None:
            return None
        revision = self.hub_revisions[where[:2]]
        return str(self.hub.folder(revision.repo, revision.revision, revision.checkpoint))

    def hub_datasets(self) -> dict[str, tuple[str, str]]:
        """Every hub prompt dataset fetched: repo -> (its dataset config, revision: the
        ``prompts.revisions`` pin, else main).
        """
        return {
            SOURCES[source]["hub"]: (SOURCES[source]["config"], revision)
            for source, revision in self.prompt_hub_sources()
        }

    def fetches(self) -> list[tuple[str, str, str, str, str]]:
        """(lock kind, repo, revision, folder, manifest) of every fetch: the prompt datasets,
        then the model revisions (``lockfile.adopt_all`` and ``stale`` read them).
        """
        hub = self.hub
        datasets = [
            (
                "dataset",
                repo,
                revision,
                hub.dataset_folder(repo, revision),
                hub.manifest("dataset", repo, revision),
            )
            for repo, (_, revision) in self.hub_datasets().items()
        ]
        return datasets + [
            (
                "model",
                r.repo,
                r.revision,
                hub.folder(r.repo, r.revision, r.checkpoint),
                hub.manifest("checkpoint" if r.checkpoint else "model", r.repo, r.revision),
            )
            for r in self.hub_revisions.values()
        ]

    def unfetched(self) -> str | None:
        """One line for the first fetched revision folder that lacks files its manifest lists
        (emptied or damaged: a job would fail on it, and its retry again), naming the command
        that fetches it; None when there is none (a missing folder is fetched by its rule).
        """
        hub = self.hub
        for revision in self.hub_revisions.values():
            folder = hub.folder(revision.repo, revision.revision, revision.checkpoint)
            if missing_files(folder):
                model = revision.consumers[0][0]
                return incomplete(folder, f"models.{model}", revision.repo, revision.revision)
        return None

    def lane_before(self, repo: str, revision: str) -> list[str]:
        """The outputs of the jobs of the checkpoint revision before this one in its lane of
        ``hub.max_revisions`` (fetched ahead and kept, ``max_revisions: all``: none).
        """
        hub = self.hub
        if hub.ahead:
            return []
        revisions = list(self.hub_revisions.values())
        before = predecessor(revisions, self.hub_revisions[(repo, revision)], hub.max_revisions)
        if before is None:
            return []
        evaluated = self.evaluated(self.models)
        done = [f"results/extract/{model}/{step}/depth.nc" for model, step in before.consumers]
        done += [f"results/evaluate/{m}/{s}.nc" for m, s in before.consumers if m in evaluated]
        return done

    def threads(self, section: str) -> int:
        """Threads of the jobs of ``section`` (extract: extraction and evaluation; train; vit)."""
        return self.job_threads[section]

    @property
    def vit_metric(self) -> MetricConfig:
        """The metrics section at the ViT sweep's K list (``vit.ks``)."""
        if self.vit is None:
            raise ValueError("vit_metric: the ViT sweep is off (vit.enabled: false)")
        return self.metric.at(self.vit.ks)

    def prompt_hub(self, prompt_set: str) -> list[str]:
        """The hub datasets a prompt set samples from (``prompts.sets.<set>.hub``)."""
        return list(self.prompt_sets[prompt_set].get("hub", []))

    def prompt_hub_sources(self) -> list[tuple[str, str]]:
        """Every (hub dataset, revision) that a prompt set samples from, each once."""
        sources = [s for spec in self.prompt_sets.values() for s in spec.get("hub", [])]
        return [(s, self.prompt_revisions.get(s, "main")) for s in dict.fromkeys(sources)]

    def shakespeare(self, prompt_set: str) -> dict[str, int] | None:
        """The held-out passages a prompt set takes (n, skip_chars, chars), or None."""
        n = self.prompt_sets[prompt_set].get("shakespeare")
        if not n:
            return None
        return {"n": n, "skip_chars": self.heldout_chars, "chars": self.passage_chars}

    def extract_options(self, model: str) -> dict[str, Any]:
        """The ``extract`` section as it applies to one model (``token_families: false``: no
        token prompts).
        """
        section = dict(self.extract)
        if not self.models[model].token_families:
            section["token_prompts"] = 0
        return section

    def extraction_for(self, model: str) -> ExtractConfig:
        """The checked ``ExtractConfig`` as it applies to one model (the planner's and the
        checks' options; jobs rebuild the same from ``extract_options``).
        """
        if self.models[model].token_families:
            return self.extraction
        return replace(self.extraction, token_prompts=0)

    def device(self, model: str) -> str:
        """A model's device: its ``load.device``, else ``extract.device``."""
        return str(self.models[model].load.get("device", self.extract["device"]))

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
        return size or self.extract.get("prompts_per_shard")

    def sharded(self, sharded: bool) -> list[str]:
        """The models extracted in several shards (``True``) or in one job (``False``)."""
        return [name for name in self.models if (len(self.shards(name)) > 1) == sharded]

    def run_measured(self, run: str) -> list[tuple[str, str]]:
        """``(model, step)`` of every measurement of the models trained by ``run`` (one
        extraction job each, not sharded): the ``extract_run_<run>`` job extracts (and scores) them
        all, ``metrics_<run>`` computes their measures, in one process each.
        """
        return [
            (name, step)
            for name in self.run_models
            if self.models[name].source["train"] == run
            for step in self.models[name].measured_steps
        ]

    @property
    def run_models(self) -> list[str]:
        """The models measured by their run's jobs (trained here, extracted in one job): a
        small model's per-job start-up (~10 s of imports) outweighs its Jacobians (~1 s).
        """
        return [
            name
            for name, entry in self.models.items()
            if entry.is_trained_here and len(self.shards(name)) == 1
        ]

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
    def cross_model(self) -> dict[str, ModelEntry]:
        """Models of the cross-model analysis (steps final/random)."""
        return {n: e for n, e in self.models.items() if not e.is_checkpoint_suite}

    @property
    def checkpoint_models(self) -> dict[str, ModelEntry]:
        """Checkpoint suites (steps are checkpoint numbers)."""
        return {n: e for n, e in self.models.items() if e.is_checkpoint_suite}

    @property
    def calibration_ks(self) -> list[int]:
        """The Ks of the calibration table: the statistics' K and the largest of metrics.ks."""
        return sorted({int(self.selection.k), max(self.metric.ks)})

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
        return bool(self.extraction.token_layers) and self.extraction.token_prompts > 0

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
            train, extract = vit_folder("train", *point), vit_folder("extract", *point)
            out += [f"{train}/model.safetensors", f"{train}/history.csv"]
            out += [f"{extract}/{kind}.nc" for kind in EXTRACTED]
        out.append("results/vit/combined.nc")
        return out + [f"results/stats/{name}.csv" for name in VIT_STATS_TABLES]
