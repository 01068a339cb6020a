"""The Snakemake workflow: bad configs stop before any job; reruns touch exactly what changed."""

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

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
TARGET = "results/combined/coupling.nc"

MINIMAL = {
    "prompts": {"sets": {"mini": {"file": "prompts.jsonl"}}, "n_per_source": 1, "seed": 0},
    "extract": {
        "prompt_set": "mini",
        "k_max": 4,
        "max_tokens": 6,
        "token_layers": [],
        "threads": 1,
    },
    "metrics": {"ks": [2, 4]},
    "random_init": {"enabled": True, "seed": 0},
    "models": {
        "tiny": {
            "source": {"train": "tiny", "checkpoint": "last"},
            "meta": {"n_layers": 2, "d_model": 16},
        }
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
    "evaluate": {"enabled": False},
    "stats": {"k": 2, "n_boot": 20},
}
PROMPTS = [
    '{"id": "arc-0001", "source": "arc", "text": "Which planet is closest to the sun?"}',
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
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def planned(folder: Path, env: dict | None = None) -> dict[str, int]:
    """Rule -> job count of a dry run towards TARGET."""
    result = snakemake(folder, "-n", TARGET, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout + result.stderr
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A minimal workflow run to the combined coupling file (train, prompts, extract, metrics)."""
    folder = tmp_path_factory.mktemp("workflow")
    (folder / "prompts.jsonl").write_text("\n".join(PROMPTS) + "\n")
    write_config(folder, MINIMAL)
    result = snakemake(folder, "--cores", "2", TARGET)
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


def test_changing_k_or_reading_reruns_metrics_not_jacobians(done: Path, tmp_path: Path) -> None:
    folder = variant(done, tmp_path, lambda c, f: c["metrics"].update(ks=[2, 3]))
    assert planned(folder) == {"metrics": 2, "combine_models": 1, "all": 0} or planned(folder) == {
        "metrics": 2,
        "combine_models": 1,
    }
    folder2 = variant(done, tmp_path / "b", lambda c, f: c["metrics"].update(readings=["offdiag"]))
    jobs = planned(folder2)
    assert "extract" not in jobs and "train_tiny" not in jobs and jobs.get("metrics") == 2


def test_adding_a_model_runs_only_its_jobs(done: Path, tmp_path: Path) -> None:
    def add(config: dict, folder: Path) -> None:
        config["models"]["tiny-init"] = {
            "source": {"train": "tiny", "checkpoint": "last"},
            "random_init": False,
        }

    jobs = planned(variant(done, tmp_path, add))
    assert jobs == {"extract": 1, "metrics": 1, "combine_models": 1}


def test_changing_prompts_reruns_extraction(done: Path, tmp_path: Path) -> None:
    def edit(config: dict, folder: Path) -> None:
        (folder / "prompts.jsonl").write_text(
            "\n".join([*PROMPTS, PROMPTS[0].replace("0001", "0002").replace("sun", "moon")]) + "\n"
        )

    jobs = planned(variant(done, tmp_path, edit))
    assert jobs.get("sample_prompts") == 1 and jobs.get("extract") == 2 and "train_tiny" not in jobs


def test_library_code_change_reruns_exactly_the_rules_it_affects(
    done: Path, tmp_path: Path
) -> None:
    """Snakemake's code trigger sees only the script file; the rules take a hash of the library
    modules they run. A copy of the package with an edited metrics.py re-runs metrics only."""
    folder = variant(done, tmp_path, lambda c, f: None)
    package = tmp_path / "site" / "blockcoupling"
    shutil.copytree(REPO / "src" / "blockcoupling", package)
    with open(package / "metrics.py", "a") as handle:
        handle.write("\n# an edit to the metric code\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    jobs = planned(folder, env=env)
    assert jobs == {"metrics": 2, "combine_models": 1}
    with open(package / "jacobians.py", "a") as handle:
        handle.write("\n# an edit to the Jacobian code\n")
    jobs = planned(folder, env=env)
    assert jobs.get("extract") == 2 and "train_tiny" not in jobs


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
            None,
        ),
        (lambda c: c["extract"].update(prompt_set="nope"), "prompt_set 'nope'"),
        (lambda c: c["prompts"]["sets"]["mini"].update(file="missing.jsonl"), "missing.jsonl"),
    ],
)
def test_bad_config_stops_before_any_job(tmp_path: Path, change, message: str | None) -> None:
    (tmp_path / "prompts.jsonl").write_text("\n".join(PROMPTS) + "\n")
    config = copy.deepcopy(MINIMAL)
    change(config)
    write_config(tmp_path, config)
    result = snakemake(tmp_path, "-n")
    text = result.stdout + result.stderr
    if message is None:  # an uninstalled package is only known when the model is loaded
        result = snakemake(tmp_path, "--cores", "1", "results/extract/bad/final/depth.nc")
        text = result.stdout + result.stderr
        assert result.returncode != 0
        assert "package 'no_such_package_xyz' is not installed" in text
        assert text.count("Traceback") == 0
        return
    assert result.returncode != 0
    assert message in text
    assert "Traceback" not in text


def test_empty_prompt_file_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text("")
    write_config(tmp_path, MINIMAL)
    result = snakemake(tmp_path, "--cores", "1", "results/prompts/mini.jsonl")
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(r"ERROR sample_prompts: .*empty", text), text[-2000:]
