"""The Snakemake workflow on a real tiny run: bad configs stop before any job; reruns touch
exactly what changed (config, prompts, each library module, deleted intermediates)."""

from __future__ import annotations

import copy
import fnmatch
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SCHEMA, copy_run, job_stats, snakemake

from blockcoupling.pipeline import figure_registry
from blockcoupling.pipeline.plan import EXTRACTED

pytestmark = pytest.mark.slow

PACKAGE = REPO / "src" / "blockcoupling"

MINIMAL = {
    "prompts": {"sets": {"mini": {"file": "prompts.jsonl"}}, "n_per_source": 1, "seed": 0},
    "extract": {
        "prompt_set": "mini",
        "k_max": 4,
        "max_tokens": 6,
        "token_layers": [-1],
        "token_prompts": 1,
        "threads": 1,
    },
    "metrics": {"ks": [2, 4]},
    "random_init": {"enabled": True, "seed": 0},
    "models": {
        "tiny": {
            "source": {"train": "tiny", "checkpoint": "last"},
            "meta": {"n_layers": 2, "d_model": 16},
        },
        "tiny-steps": {"source": {"train": "tiny"}, "meta": {"n_layers": 2, "d_model": 16}},
    },
    "train": {
        "threads": 1,
        "runs": {
            "tiny": {
                "n_layers": 2,
                "d_model": 16,
                "n_heads": 2,
                "total_steps": 2,
                "checkpoint_steps": [0, 2],
                "context_length": 16,
                "batch_size": 2,
                "vocab_size": 280,
                "n_val_windows": 2,
                "max_train_chars": 5000,
                "seed": 0,
            }
        },
    },
    "evaluate": {"enabled": True, "heldout_chars": 500, "context_length": 16},
    "stats": {"n_boot": 20},
}
PROMPTS = [
    '{"id": "arc-0001", "source": "arc", "text": "Which planet is closest?", '
    '"choices": ["Mercury", "Mars"], "answer": 0}',
    '{"id": "mmlu-0001", "source": "mmlu", "text": "What is the derivative of x squared?"}',
]


def write_config(folder: Path, config: dict) -> Path:
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def dry_run(
    folder: Path, *targets: str, env: dict | None = None
) -> tuple[dict[str, int], set[str]]:
    """A dry run (of the default target, or ``targets``): rule -> job count, and the rules
    planned because their params (the code hash among them) changed. (A job that re-runs anyway
    because an upstream job does is listed for that reason instead.)"""
    result = snakemake(folder, "-n", *targets, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout + result.stderr
    if "Nothing to be done" in text:
        return {}, set()
    jobs = job_stats(text)
    jobs.pop("all", None)
    changed, current = set(), None
    for line in text.splitlines():
        header = re.match(r"^(?:local)?rule (\w+):", line.strip())
        if header:
            current = header.group(1)
        elif current and line.strip().startswith("reason:") and "Params have changed" in line:
            changed.add(current)
    return jobs, changed


def planned(folder: Path, env: dict | None = None) -> dict[str, int]:
    """Rule -> job count of a dry run of the default target."""
    return dry_run(folder, env=env)[0]


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The minimal config run to the end: every rule (train, prompts, extract, metrics, evaluate,
    combine, stats, figures)."""
    folder = tmp_path_factory.mktemp("workflow")
    (folder / "prompts.jsonl").write_text("\n".join(PROMPTS) + "\n")
    write_config(folder, MINIMAL)
    result = snakemake(folder, "--cores", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert planned(folder) == {}
    return folder


def variant(done: Path, tmp_path: Path, change) -> Path:
    """A copy of the finished run with a changed config (metadata and mtimes kept)."""
    folder = copy_run(done, tmp_path)
    config = copy.deepcopy(MINIMAL)
    change(config, folder)
    write_config(folder, config)
    return folder


def documented_outputs(text: str) -> set[str]:
    """The output files docs/datasets.md names (``{...}``: a wildcard): each ``results/...``
    path, and each file name in a section whose heading names a ``results/`` path (in its
    folder)."""
    out, folder = set(), None
    for line in text.splitlines():
        named = re.findall(
            r"`([^`\s]+\.(?:nc|csv|jsonl?|md|png|npz|gguf|safetensors)|results/[^`\s]*/)`", line
        )
        if line.startswith("#"):
            paths = [n for n in named if n.startswith("results/")]
            folder = paths[0].rsplit("/", 1)[0] + "/" if paths else None
        for name in named:
            if name.startswith("results/"):
                out.add(name)
            elif folder and "/" not in name:
                out.add(folder + name)
    return {path for path in out if not path.endswith("/")}


# Documented outputs of what the minimal config leaves off (prefix: why).
NOT_IN_THE_MINIMAL_RUN = {
    "results/vit/": "vit.enabled is off",
    "results/stats/vit_": "vit.enabled is off",
    "results/models/": "no model is assembled from a package",
    "results/combined/checkpoints/evaluation.nc": "runs trained here are not evaluated per step",
}


def test_every_documented_output_is_produced(done: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each output docs/datasets.md documents is a file of the minimal run (but those of the
    features it leaves off, each with its reason), and so is each target of its plan
    (``Plan.targets``, and the figures whose input is among them, as rules/figures.smk asks)."""
    from blockcoupling.pipeline.checks import check_config
    from blockcoupling.pipeline.figure_registry import FIGURES
    from blockcoupling.pipeline.schema_check import validate_config

    made = [str(p.relative_to(done)) for p in (done / "results").rglob("*") if p.is_file()]
    documented = documented_outputs((REPO / "docs" / "datasets.md").read_text(encoding="utf-8"))
    left_off = {p for p in documented if any(p.startswith(k) for k in NOT_IN_THE_MINIMAL_RUN)}
    assert all(any(p.startswith(k) for p in left_off) for k in NOT_IN_THE_MINIMAL_RUN)
    missing = [
        path
        for path in sorted(documented - left_off)
        if not any(fnmatch.fnmatchcase(m, re.sub(r"\{[^}]*\}", "*", path)) for m in made)
    ]
    assert not missing, missing
    config = copy.deepcopy(MINIMAL)
    monkeypatch.chdir(done)
    validate_config(config, SCHEMA)
    targets = check_config(config, REPO).targets()
    figures = [
        f"results/figures/{name}.{kind}"
        for name, (_, source, _, _) in FIGURES.items()
        if source in targets
        for kind in ("png", "pdf")
    ]
    assert len(figures) >= 20 and not [p for p in targets + figures if p not in made]


def test_every_netcdf_has_cf_labels_and_provenance(done: Path) -> None:
    from blockcoupling.files.cf import check_files

    files, checked, problems = check_files(done / "results")
    assert files >= 20 and checked > 500 and not problems, problems[:10]


def test_results_respect_the_umask(done: Path) -> None:
    mode = (done / "results/extract/tiny/final/depth.nc").stat().st_mode & 0o777
    assert mode == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_deleted_intermediate_is_rebuilt(done: Path, tmp_path: Path) -> None:
    folder = variant(done, tmp_path, lambda c, f: None)
    (folder / "results/extract/tiny/random/depth.nc").unlink()
    jobs = planned(folder)
    assert jobs.get("extract_run_tiny") == 1 and "train_tiny" not in jobs


def test_changing_k_reextracts_and_reading_reruns_metrics_not_jacobians(
    done: Path, tmp_path: Path
) -> None:
    """Each pair stores m_K's squared numerator at the Ks of metrics.ks (extract.stored_ks:
    metrics, the default), so a new K re-extracts, never trains; a reading (both are stored)
    re-runs the metrics alone. (extract.stored_ks: all keeps every K up to k_max for sweeps.)"""
    jobs = planned(variant(done, tmp_path, lambda c, f: c["metrics"].update(ks=[2, 3])))
    assert jobs.get("metrics_tiny") == 1 and jobs.get("extract_run_tiny") == 1
    assert "train_tiny" not in jobs
    jobs = planned(
        variant(done, tmp_path / "b", lambda c, f: c["metrics"].update(readings=["offdiag"]))
    )
    assert "extract_run_tiny" not in jobs and jobs.get("metrics_tiny") == 1


def test_run_only_settings_rerun_nothing(done: Path, tmp_path: Path) -> None:
    def speed(config: dict, folder: Path) -> None:
        config["extract"].update(chunk_size=3, device="cpu")

    assert planned(variant(done, tmp_path, speed)) == {}


def test_threads_rerun_the_jobs_whose_numbers_depend_on_them(done: Path, tmp_path: Path) -> None:
    """A job computes on its configured threads (runner.math_threads), whatever cores Snakemake
    grants, and its numbers depend on them: changing them re-runs it and what follows."""
    train = variant(done, tmp_path / "train", lambda c, f: c["train"].update(threads=2))
    _, changed = dry_run(train)
    assert changed and all(rule.startswith("train_") for rule in changed), changed
    extract = variant(done, tmp_path / "extract", lambda c, f: c["extract"].update(threads=2))
    _, changed = dry_run(extract)
    assert changed == {"extract_run_tiny"}, changed


def test_n_boot_reruns_the_bootstrap_jobs_and_only_the_figures_that_draw_them(
    done: Path, tmp_path: Path
) -> None:
    jobs, changed = dry_run(variant(done, tmp_path, lambda c, f: c["stats"].update(n_boot=30)))
    assert changed == {"stats_summary", "stats_emergence"}  # the two jobs that bootstrap
    expected = {
        "stats_summary",
        "stats_emergence",
        "stats_claims",  # reads emergence.csv, whose split-half peak test bootstraps
        "figure_coupling_vs_score",  # draws the summary's CIs
        "figure_coupling_vs_step",  # draws the checkpoint table's CIs
    }
    quoting = {f"figure_{name}" for name in figure_registry.CLAIM_FIGURES.values()}
    assert expected <= set(jobs) and set(jobs) - expected <= quoting, set(jobs)  # + claims' quotes


def test_adding_a_model_runs_only_its_jobs(done: Path, tmp_path: Path) -> None:
    def add(config: dict, folder: Path) -> None:
        config["models"]["tiny-init"] = {
            "source": {"train": "tiny", "checkpoint": "last"},
            "random_init": False,
        }

    jobs = planned(variant(done, tmp_path, add))  # a run's models are measured in one job
    assert jobs.get("extract_run_tiny") == 1 and jobs.get("metrics_tiny") == 1
    assert "train_tiny" not in jobs


def test_changing_prompts_reruns_extraction(done: Path, tmp_path: Path) -> None:
    def edit(config: dict, folder: Path) -> None:
        extra = PROMPTS[1].replace("mmlu-0001", "mmlu-0002").replace("x squared", "x cubed")
        (folder / "prompts.jsonl").write_text("\n".join([*PROMPTS, extra]) + "\n")

    jobs = planned(variant(done, tmp_path, edit))
    assert jobs.get("sample_prompts") == 1 and jobs.get("extract_run_tiny") == 1
    assert "train_tiny" not in jobs


def test_training_changes_retrain_from_scratch(done: Path, tmp_path: Path) -> None:
    """A new seed retrains in a fresh work folder (the stale one is removed), never reusing the
    old weights."""
    folder = variant(done, tmp_path, lambda c, f: c["train"]["runs"]["tiny"].update(seed=1))
    before = (folder / "results/train/tiny/step2/model.safetensors").read_bytes()
    old_work = sorted(p.name for p in (folder / "results/train/tiny").glob("work-*"))
    result = snakemake(folder, "--cores", "1", "results/train/tiny/history.csv")
    assert result.returncode == 0, result.stderr[-2000:]
    after = (folder / "results/train/tiny/step2/model.safetensors").read_bytes()
    new_work = sorted(p.name for p in (folder / "results/train/tiny").glob("work-*"))
    assert after != before
    assert len(old_work) == len(new_work) == 1 and old_work != new_work


def _script_of(rule: str) -> str:
    prefixes = (
        ("figure_", "figure"),
        ("combine_", "combine"),
        ("train_", "train"),
        ("extract_run_", "extract_run"),
        ("metrics_", "metrics"),
    )
    for prefix, script in prefixes:
        if rule.startswith(prefix):
            return script
    return rule


def _imported_at_run_time(scripts: list[str]) -> dict[str, set[str]]:
    """The package modules each script imports, found by importing it (run_script disabled): an
    independent check of the AST-derived hashes. One process loads the third-party libraries,
    then imports each script in a child of its own (fork), which starts with no package module.
    """
    code = f"""
import json, os, runpy, sys, traceback
import accelerate, matplotlib, numpy, pandas, scipy.stats, statsmodels.api, torch, transformers
import xarray
for script in {scripts!r}:
    pid = os.fork()
    if pid == 0:
        try:
            import blockcoupling.runtime.runner as r
            r.run_script = lambda *a: None
            runpy.run_path(f"{REPO / "scripts"}/{{script}}.py", init_globals={{"snakemake": None}})
            found = sorted(m for m in sys.modules if m.startswith("blockcoupling."))
            print(json.dumps([script, found]), flush=True)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]):
        sys.exit(f"importing {{script}} failed")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return {script: set(found) for script, found in map(json.loads, out.stdout.splitlines())}


# Upstream rules of each rule in the minimal run's DAG (transitively).
ANCESTORS = {
    "sample_prompts": set(),
    "train_tiny": set(),
    "heldout_text": set(),
    "extract_run_tiny": {"sample_prompts", "train_tiny", "heldout_text"},
    "metrics_tiny": {"sample_prompts", "train_tiny", "heldout_text", "extract_run_tiny"},
}
ANCESTORS["combine_checkpoints"] = ANCESTORS["metrics_tiny"] | {"metrics_tiny"}
ANCESTORS["combine_models"] = ANCESTORS["metrics_tiny"] | {"metrics_tiny"}
ANCESTORS["stats"] = ANCESTORS["combine_models"] | {"combine_models"}
ANCESTORS["stats_summary"] = ANCESTORS["stats"]
ANCESTORS["figure_depth_heatmaps"] = ANCESTORS["stats"]
ANCESTORS["stats_checkpoints"] = ANCESTORS["combine_checkpoints"] | {"combine_checkpoints"}
ANCESTORS["stats_emergence"] = ANCESTORS["stats_checkpoints"]
# Upstream rules that every job of the rule has: a combine job of spectra or trajectories reads
# extraction files only, so it re-runs for its own params where metrics and it import a module
# that extract does not.
EVERY_JOBS_ANCESTORS = {
    **ANCESTORS,
    "combine_models": ANCESTORS["extract_run_tiny"] | {"extract_run_tiny"},
    "combine_checkpoints": ANCESTORS["extract_run_tiny"] | {"extract_run_tiny"},
}


@pytest.fixture(scope="module")
def imports() -> dict[str, set[str]]:
    """Rule -> the package modules its script imports when it runs."""
    found = _imported_at_run_time(sorted({_script_of(rule) for rule in ANCESTORS}))
    return {rule: found[_script_of(rule)] for rule in ANCESTORS}


def _module_files() -> dict[str, Path]:
    """Dotted module name -> its file, subpackages (figures/) included."""
    return {
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
        if p != PACKAGE / "__init__.py"
    }


def _importers(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module -> the rules whose script imports it."""
    return {
        module: {rule for rule in ANCESTORS if f"blockcoupling.{module}" in imports[rule]}
        for module in _module_files()
    }


def _frontier(importers: set[str]) -> set[str]:
    """Of the rules whose code changed, those that re-run for changed params: those with a job
    that has no such rule upstream (the others re-run for their updated input)."""
    return {rule for rule in importers if not EVERY_JOBS_ANCESTORS[rule] & importers}


def _edit_groups(importers: dict[str, set[str]]) -> list[list[str]]:
    """Modules to edit together, one DAG build per group, so that each rule re-runs for changed
    params in one build: a module joins a group where it adds a rule not yet seen re-running
    for them and takes none of the group's away (by changing a rule upstream of it)."""
    unseen, groups = set(ANCESTORS), []
    while unseen:
        group, edited = [], set()
        for module in sorted(importers, key=lambda m: (len(importers[m]), m)):
            both = edited | importers[module]
            added = _frontier(both) - _frontier(edited)
            if _frontier(both) >= _frontier(edited) and added & unseen:
                group.append(module)
                edited = both
        assert group, f"no module edit re-runs {sorted(unseen)} for their params"
        unseen -= _frontier(edited)
        groups.append(group)
    return groups


def test_editing_any_module_changes_the_code_hash_of_exactly_the_rules_that_import_it(
    imports: dict[str, set[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For every library module: with it edited (comment appended, in a copy of the package),
    the code hash (the rules' ``code`` param) of a rule's script changes exactly where the
    script imports the module when it runs."""
    from blockcoupling.pipeline import code_hash as hashing

    copied = tmp_path / "blockcoupling"
    shutil.copytree(PACKAGE, copied)
    monkeypatch.setattr(hashing, "SOURCE_DIR", copied)
    # a comment changes no import: each file is parsed once
    monkeypatch.setattr(hashing, "_imported_modules", functools.cache(hashing._imported_modules))
    scripts = {rule: REPO / "scripts" / f"{_script_of(rule)}.py" for rule in ANCESTORS}
    before = {rule: hashing.code_hash(script) for rule, script in scripts.items()}
    importers = _importers(imports)
    for module, path in _module_files().items():
        file = copied / path.relative_to(PACKAGE)
        text = file.read_bytes()
        file.write_bytes(text + b"\n# an edit\n")
        changed = {r for r, script in scripts.items() if hashing.code_hash(script) != before[r]}
        file.write_bytes(text)
        assert changed == importers[module], module


def test_editing_modules_reruns_exactly_the_rules_that_import_them(
    done: Path, imports: dict[str, set[str]], tmp_path: Path
) -> None:
    """Library modules edited in a copy of the package (comment appended), a group per dry run
    (``_edit_groups``: each rule's code changes in one with none upstream of it): each re-runs,
    for changed params, exactly the rules whose script imports an edited module (those with a
    job that has no importing rule upstream; the others re-run for their updated input), and
    nothing that neither imports one nor lies downstream of a rule that does. With the test
    above (each module's edit changes the code hash of exactly the rules importing it), every
    module's edit re-runs exactly those rules."""
    files, importers = _module_files(), _importers(imports)
    folder = variant(done, tmp_path, lambda c, f: None)
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(site)}
    for group in _edit_groups(importers):
        shutil.rmtree(site, ignore_errors=True)
        shutil.copytree(PACKAGE, site / "blockcoupling")
        for module in group:
            with open(site / "blockcoupling" / files[module].relative_to(PACKAGE), "a") as handle:
                handle.write("\n# an edit\n")
        edited = set().union(*(importers[module] for module in group))
        jobs, changed = dry_run(folder, env=env)
        assert changed & set(ANCESTORS) == _frontier(edited), (group, changed)
        affected = edited | {r for r in ANCESTORS if ANCESTORS[r] & edited}
        assert set(jobs) & set(ANCESTORS) <= affected, group


def test_empty_prompt_file_is_one_clear_line_before_any_job(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text("")
    write_config(tmp_path, MINIMAL)
    result = snakemake(tmp_path, "--cores", "1", "results/prompts/mini.jsonl")
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert "config error: prompts.sets.mini.file: prompt file is empty" in text, text[-2000:]
    assert "Traceback" not in text
    assert not (tmp_path / "logs").exists()  # no job ran


def test_prompt_shards_merge_into_the_same_files_and_a_killed_shard_reruns_alone(
    done: Path, tmp_path: Path
) -> None:
    """One prompt per shard (its token families in a job of their own): a shard killed before
    it wrote its outputs (the others done) re-runs alone, then the merge; the merged files
    equal the one-job files of the finished run, and the temporary shards are gone."""
    import xarray as xr

    from blockcoupling.files.io import read_netcdf

    def shard(config: dict, folder: Path) -> None:
        config["extract"]["prompts_per_shard"] = 1

    folder = variant(done, tmp_path, shard)
    shards = folder / "results/extract/tiny/final/shards"
    parts = [f"{shards.relative_to(folder)}/0/{kind}.nc" for kind in EXTRACTED]
    parts.append(f"{shards.relative_to(folder)}/tokens/0/tokens.nc")
    result = snakemake(folder, "--cores", "2", *parts)  # the second shard's job: killed
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (shards / "1").exists()
    jobs = dry_run(folder, "results/extract/tiny/final/depth.nc")[0]
    assert jobs == {"extract_shard": 1, "merge_shards": 1}
    result = snakemake(folder, "--cores", "2", "results/extract/tiny/final/depth.nc")
    assert result.returncode == 0, result.stderr[-3000:]
    for kind in EXTRACTED:
        merged = read_netcdf(folder / f"results/extract/tiny/final/{kind}.nc")
        whole = read_netcdf(done / f"results/extract/tiny/final/{kind}.nc")
        merged.attrs.pop("history"), whole.attrs.pop("history")  # their commands: merge, extract
        # the J_tt record counts its own jobs' calls: one job's file counts the token families'
        # too, the shards' merge those of the depth shards (the token job's are in its file)
        record = [key for key in whole.attrs if key.startswith("jtt_")]
        assert all(key in merged.attrs for key in record), (kind, record)
        for key in record:
            merged.attrs.pop(key), whole.attrs.pop(key)
        xr.testing.assert_identical(merged, whole)
    assert not list(shards.rglob("*.nc"))
