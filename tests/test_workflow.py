"""The Snakemake workflow on a real tiny run: bad configs stop before any job; reruns touch
exactly what changed (config, prompts, each library module, deleted intermediates)."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from blockcoupling.pipeline.plan import EXTRACTED

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "blockcoupling"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

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


def snakemake(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [
        *SNAKEMAKE,
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(folder),
        "--configfile",
        str(folder / "config.yaml"),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


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
    table = text.split("Job stats:")[1].split("total")[0]
    jobs = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}
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
    folder = tmp_path / "run"
    shutil.copytree(done, folder, symlinks=True)
    config = copy.deepcopy(MINIMAL)
    change(config, folder)
    write_config(folder, config)
    return folder


def test_every_documented_output_is_a_target(done: Path) -> None:
    for pattern in (
        "results/extract/tiny/final/depth.nc",
        "results/extract/tiny-steps/2/tokens.nc",
        "results/metrics/tiny/random/coupling.nc",
        "results/evaluate/tiny/final.nc",
        "results/train/tiny/history.csv",
        "results/stats/summary.csv",
        "results/stats/checkpoint_table.csv",
        "results/figures/depth_heatmaps.png",
        "results/figures/coupling_vs_step.png",
    ):
        assert (done / pattern).is_file(), pattern


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
    assert jobs.get("extract") == 1 and "train_tiny" not in jobs


def test_changing_k_or_reading_reruns_metrics_not_jacobians(done: Path, tmp_path: Path) -> None:
    jobs = planned(variant(done, tmp_path, lambda c, f: c["metrics"].update(ks=[2, 3])))
    assert jobs.get("metrics") == 4 and "extract" not in jobs and "train_tiny" not in jobs
    jobs = planned(
        variant(done, tmp_path / "b", lambda c, f: c["metrics"].update(readings=["offdiag"]))
    )
    assert "extract" not in jobs and jobs.get("metrics") == 4


def test_run_only_settings_rerun_nothing(done: Path, tmp_path: Path) -> None:
    def speed(config: dict, folder: Path) -> None:
        config["extract"].update(chunk_size=3, threads=2, device="cpu")
        config["train"]["threads"] = 2

    assert planned(variant(done, tmp_path, speed)) == {}


def test_n_boot_reruns_the_bootstrap_jobs_and_only_the_figures_that_draw_them(
    done: Path, tmp_path: Path
) -> None:
    jobs, changed = dry_run(variant(done, tmp_path, lambda c, f: c["stats"].update(n_boot=30)))
    assert changed == {"stats_summary", "stats_emergence"}  # the two jobs that bootstrap
    assert set(jobs) == {
        "stats_summary",
        "stats_emergence",
        "stats_claims",  # reads emergence.csv, whose split-half peak test bootstraps
        "figure_coupling_vs_score",  # draws the summary's CIs
        "figure_coupling_vs_step",  # draws the checkpoint table's CIs
    }


def test_adding_a_model_runs_only_its_jobs(done: Path, tmp_path: Path) -> None:
    def add(config: dict, folder: Path) -> None:
        config["models"]["tiny-init"] = {
            "source": {"train": "tiny", "checkpoint": "last"},
            "random_init": False,
        }

    jobs = planned(variant(done, tmp_path, add))
    assert jobs.get("extract") == 1 and jobs.get("metrics") == 1 and jobs.get("evaluate") == 1
    assert "train_tiny" not in jobs


def test_changing_prompts_reruns_extraction(done: Path, tmp_path: Path) -> None:
    def edit(config: dict, folder: Path) -> None:
        extra = PROMPTS[1].replace("mmlu-0001", "mmlu-0002").replace("x squared", "x cubed")
        (folder / "prompts.jsonl").write_text("\n".join([*PROMPTS, extra]) + "\n")

    jobs = planned(variant(done, tmp_path, edit))
    assert jobs.get("sample_prompts") == 1 and jobs.get("extract") == 4
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
    for prefix, script in (("figure_", "figure"), ("combine_", "combine"), ("train_", "train")):
        if rule.startswith(prefix):
            return script
    return rule


def _imported_at_run_time(script: str) -> set[str]:
    """The package modules a script imports, found by importing it (run_script disabled): an
    independent check of the AST-derived hashes."""
    code = (
        "import runpy, sys, blockcoupling.runtime.runner as r\n"
        "r.run_script = lambda *a: None\n"
        f"runpy.run_path({str(REPO / 'scripts' / f'{script}.py')!r}, "
        "init_globals={'snakemake': None})\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('blockcoupling.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


# Upstream rules of each rule in the minimal run's DAG (transitively).
ANCESTORS = {
    "sample_prompts": set(),
    "train_tiny": set(),
    "heldout_text": set(),
    "extract": {"sample_prompts", "train_tiny"},
    "evaluate": {"sample_prompts", "train_tiny", "heldout_text"},
    "metrics": {"sample_prompts", "train_tiny", "extract"},
    "combine_checkpoints": {"sample_prompts", "train_tiny", "extract", "metrics"},
}
ANCESTORS["combine_models"] = ANCESTORS["metrics"] | ANCESTORS["evaluate"] | {"metrics", "evaluate"}
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
    "combine_models": ANCESTORS["extract"] | {"extract"},
    "combine_checkpoints": ANCESTORS["extract"] | {"extract"},
}


def test_editing_each_module_reruns_exactly_the_rules_that_import_it(
    done: Path, tmp_path: Path
) -> None:
    """For every library module: a copy of the package with that module edited (comment
    appended) re-runs, for changed params, exactly the rules whose script imports it (those
    with a job that has no importing rule upstream; the others re-run for their updated input),
    and nothing
    that neither imports it nor lies downstream of a rule that does."""
    imports = {rule: _imported_at_run_time(_script_of(rule)) for rule in ANCESTORS}
    folder = variant(done, tmp_path, lambda c, f: None)
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(site)}
    files = {  # dotted module name -> its file, subpackages (figures/) included
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
        if p != PACKAGE / "__init__.py"
    }
    for module in sorted(files):
        shutil.rmtree(site, ignore_errors=True)
        shutil.copytree(PACKAGE, site / "blockcoupling")
        with open(site / "blockcoupling" / files[module].relative_to(PACKAGE), "a") as handle:
            handle.write("\n# an edit\n")
        importers = {rule for rule in ANCESTORS if f"blockcoupling.{module}" in imports[rule]}
        frontier = {rule for rule in importers if not EVERY_JOBS_ANCESTORS[rule] & importers}
        jobs, changed = dry_run(folder, env=env)
        assert changed & set(ANCESTORS) == frontier, module
        affected = importers | {r for r in ANCESTORS if ANCESTORS[r] & importers}
        assert set(jobs) & set(ANCESTORS) <= affected, module


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["extract"].update(k_maxx=3), "k_maxx"),
        (lambda c: c["metrics"].update(ks=[2, 9]), "K=9 > extract.k_max=4"),
        (lambda c: c["models"].update(bad={"source": {"hub": "x/y", "package": "p"}}), "source"),
        (
            lambda c: c["models"].update(
                bad={"source": {"package": "no_such_package_xyz", "file": "m.gguf"}}
            ),
            "package 'no_such_package_xyz' is not installed",
        ),
        (
            lambda c: c["models"].update(bad={"source": {"path": "no/such/folder"}}),
            "models.bad.source: model path 'no/such/folder' does not exist",
        ),
        (lambda c: c["extract"].update(prompt_set="nope"), "prompt_set 'nope'"),
        (lambda c: c["prompts"]["sets"]["mini"].update(file="missing.jsonl"), "missing.jsonl"),
        (lambda c: c.update(models={}), "no models"),
        (lambda c: c["stats"].update(k=3), "stats.k=3 is not in metrics.ks [2, 4]"),
        (
            lambda c: c["stats"].update(variant="vju") or c["extract"].update(variants=["ujv"]),
            "stats.variant='vju'",
        ),
        (lambda c: c.update(figures={"token_model": "nope"}), "figures.token_model 'nope'"),
        (lambda c: c["train"]["runs"]["tiny"].update(n_headz=2), "n_headz"),
        (
            lambda c: c["train"]["runs"]["tiny"].update(n_heads=3),
            "train.runs.tiny: d_model 16 is not divisible by n_heads 3",
        ),
        (
            lambda c: c["train"]["runs"].update(
                {"tiny_b": {"n_layers": 1}, "tiny-b": {"n_layers": 1}}
            ),
            "collide",
        ),
    ],
)
def test_bad_config_stops_before_any_job(tmp_path: Path, change, message: str) -> None:
    (tmp_path / "prompts.jsonl").write_text("\n".join(PROMPTS) + "\n")
    config = copy.deepcopy(MINIMAL)
    change(config)
    write_config(tmp_path, config)
    result = snakemake(tmp_path, "-n")
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert message in text, text[-1500:]
    assert "Traceback" not in text


def test_a_hub_id_without_organisation_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text("\n".join(PROMPTS) + "\n")
    config = copy.deepcopy(MINIMAL)
    config["models"]["gpt2"] = {"source": {"hub": "gpt2"}}
    write_config(tmp_path, config)
    result = snakemake(tmp_path, "-n")
    assert result.returncode == 0, result.stderr[-1500:]


def test_non_utf8_prompt_file_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_bytes('{"text": "caf\u00e9 au lait"}\n'.encode("latin-1"))
    write_config(tmp_path, MINIMAL)
    result = snakemake(tmp_path, "-n")
    text = result.stdout + result.stderr
    assert result.returncode != 0 and "is not UTF-8 text" in text and "prompts.jsonl" in text


def test_empty_prompt_file_is_one_clear_line_before_any_job(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text("")
    write_config(tmp_path, MINIMAL)
    result = snakemake(tmp_path, "--cores", "1", "results/prompts/mini.jsonl")
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert "config error: prompts.sets.mini.file: prompt file is empty" in text, text[-2000:]
    assert not (tmp_path / "logs").exists()  # no job ran


def test_prompt_shards_merge_into_the_same_files_and_a_killed_shard_reruns_alone(
    done: Path, tmp_path: Path
) -> None:
    """One prompt per shard (its token families in a job of their own): a shard killed before
    the merge (its outputs missing, the others there) re-runs alone, then the merge; the merged
    files equal the one-job files of the finished run, and the temporary shards are gone."""
    import xarray as xr

    from blockcoupling.files.io import read_netcdf

    def shard(config: dict, folder: Path) -> None:
        config["extract"]["prompts_per_shard"] = 1

    folder = variant(done, tmp_path, shard)
    shards = folder / "results/extract/tiny/final/shards"
    parts = [f"{shards.relative_to(folder)}/{i}/{k}.nc" for i in (0, 1) for k in EXTRACTED]
    parts.append(f"{shards.relative_to(folder)}/tokens/0/tokens.nc")
    result = snakemake(folder, "--cores", "2", *parts)
    assert result.returncode == 0, result.stderr[-3000:]
    for kind in EXTRACTED:  # the second shard's job was killed
        (shards / "1" / f"{kind}.nc").unlink()
    jobs = dry_run(folder, "results/extract/tiny/final/depth.nc")[0]
    assert jobs == {"extract_shard": 1, "merge_shards": 1}
    result = snakemake(folder, "--cores", "2", "results/extract/tiny/final/depth.nc")
    assert result.returncode == 0, result.stderr[-3000:]
    for kind in EXTRACTED:
        merged = read_netcdf(folder / f"results/extract/tiny/final/{kind}.nc")
        whole = read_netcdf(done / f"results/extract/tiny/final/{kind}.nc")
        xr.testing.assert_identical(merged, whole)
    assert not list(shards.rglob("*.nc"))
