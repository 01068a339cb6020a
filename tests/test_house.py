"""The seams: config checks as a library call, code hashes, the CLI, atomic writes, torch-free
analysis, the keyed training folder, unreadable files."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from conftest import REPO, SCHEMA
from snakemake.utils import validate

from blockcoupling import cli
from blockcoupling.coupling.metrics import MetricConfig
from blockcoupling.files import io
from blockcoupling.jacobians.options import MeasureConfig, science_params
from blockcoupling.lm.schedule import TrainConfig
from blockcoupling.lm.train import work_dir
from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.code_hash import code_hash, script_modules
from blockcoupling.pipeline.figure_registry import FIGURES
from blockcoupling.pipeline.plan import Plan
from blockcoupling.stats.selection import Selection


def checked(config: dict) -> Plan:
    config = copy.deepcopy(config)
    validate(config, SCHEMA)
    return check_config(config, REPO)


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


@pytest.mark.parametrize("name", ["config.yaml", "config/smoke.yaml", "config/paper.yaml"])
def test_shipped_configs_pass_the_checks(name: str) -> None:
    plan = checked(load(name))
    assert plan.models and plan.selection["k"] in plan.metric.ks


def test_schema_defaults_equal_the_library_defaults() -> None:
    config = {"prompts": {"sets": {"s": {"file": "x.jsonl"}}}, "extract": {"prompt_set": "s"}}
    config["metrics"] = {"ks": [10]}
    validate(config, SCHEMA)
    measure = MeasureConfig.from_config(config["extract"])
    assert measure == MeasureConfig(k_max=measure.k_max)  # every other field at its default
    assert measure.k_max == 50
    metric = MetricConfig.from_config(config["metrics"])
    assert (metric.readings, metric.norms, metric.p) == (
        MetricConfig().readings,
        MetricConfig().norms,
        MetricConfig().p,
    )
    assert config["extract"]["device"] == "auto"
    assert config["stats"]["k"] is None and config["evaluate"]["enabled"] is True


def test_statistics_follow_the_first_k_when_stats_has_no_section() -> None:
    config = load("config/smoke.yaml")
    config.pop("stats")
    config["metrics"]["ks"] = [4, 8]
    plan = checked(config)
    assert plan.selection == Selection(k=4, reading="authors", variant="ujv", norm="p")


def test_unknown_extract_key_names_it() -> None:
    with pytest.raises(ValueError, match="extract: unknown key 'k_maxx'"):
        MeasureConfig.from_config({"k_maxx": 3})
    with pytest.raises(ValueError, match="metrics: unknown key 'kz'"):
        MetricConfig.from_config({"kz": [3]})


def test_run_only_keys_are_not_science_params() -> None:
    section = {"prompt_set": "s", "k_max": 5, "threads": 4, "device": "cuda", "chunk_size": 64}
    assert science_params(section) == {"k_max": 5}


def test_targets_hold_every_documented_output() -> None:
    plan = checked(load("config/smoke.yaml"))
    targets = plan.targets()
    assert "results/extract/fixed_size-f0.5-s0-final/random/spectra.nc" in targets  # the twin
    assert not [t for t in targets if "f1.0-s0-final/random" in t]  # measured once, above
    assert not [t for t in targets if t.startswith("results/evaluate/") and "/random" in t]
    assert "results/metrics/emergence-s0/8/token_coupling.nc" in targets
    assert "results/evaluate/fixed_size-f0.5-s1-final/final.nc" in targets
    assert not [t for t in targets if t.startswith("results/evaluate/emergence-s0/")]  # history


def test_code_hashes_follow_imports_transitively() -> None:
    modules = script_modules(REPO / "scripts" / "train.py")
    assert "blockcoupling.lm.schedule" in modules  # imported by train.py, not by the script
    assert "blockcoupling.stats.core" in script_modules(REPO / "scripts" / "figure.py")
    assert "blockcoupling.pipeline.checks" not in modules
    assert code_hash(REPO / "scripts" / "metrics.py") != code_hash(REPO / "scripts" / "stats.py")


def test_code_hashes_see_every_import_ast_walk_sees() -> None:
    """The hashes read imports from statements only (not expressions): in every Python file of
    the repository, and in imports nested in every kind of block, they are ast.walk's."""
    import ast

    from blockcoupling.pipeline.code_hash import _import_statements

    nested = (
        "def f():\n    class C:\n        import a\n    with x:\n        import b\n"
        "try:\n    import c\nexcept E:\n    import d\nelse:\n    import e\nfinally:\n"
        "    import f\nfor i in x:\n    pass\nelse:\n    import g\nwhile x:\n"
        "    import h\nmatch x:\n    case 1:\n        from i import j\n"
    )
    files = [p for p in REPO.rglob("*.py") if ".venv" not in p.parts and "results" not in p.parts]
    for text in [nested, *(p.read_text(encoding="utf-8") for p in files)]:
        tree = ast.parse(text)
        walked = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        found = [n for n in _import_statements(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert sorted(map(ast.dump, found)) == sorted(map(ast.dump, walked))
    assert len(files) > 100


def test_figure_registry_is_read_without_importing_figures() -> None:
    code = (
        "import sys; from blockcoupling.pipeline.figure_registry import FIGURES as r; "
        "assert 'depth_heatmaps' in r and 'matplotlib' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    missing = [n for n in FIGURES if not (REPO / "report" / f"{n}.rst").is_file()]
    assert not missing, f"figures without a caption: {missing}"


def test_atomic_write_respects_the_umask(tmp_path: Path) -> None:
    import os

    previous = os.umask(0o027)
    try:
        path = io.write_text(tmp_path / "a" / "b.txt", "hello")
    finally:
        os.umask(previous)
    assert path.read_text() == "hello" and path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in path.parent.iterdir()] == ["b.txt"]  # no temp file left


def test_a_truncated_netcdf_names_the_file_and_the_remedy(tmp_path: Path) -> None:
    path = io.write_netcdf(xr.Dataset({"lss": ("token", np.arange(1000.0))}), tmp_path / "x.nc")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"x.nc cannot be read .*delete it and run snakemake"):
        io.read_netcdf(path)


def test_training_folder_is_keyed_to_config_and_code(tmp_path: Path) -> None:
    config = TrainConfig(n_layers=1, d_model=8, n_heads=2, total_steps=2)
    first = work_dir(tmp_path, config, "code1")
    first.mkdir()
    assert work_dir(tmp_path, config, "code1") == first and first.is_dir()
    changed = work_dir(
        tmp_path, TrainConfig(n_layers=1, d_model=8, n_heads=2, total_steps=2, seed=1), "code1"
    )
    assert changed != first and not first.exists()  # the stale folder is gone
    assert work_dir(tmp_path, config, "code2") not in (first, changed)


def test_cli_check_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["check-config", str(REPO / "config" / "smoke.yaml")]) == 0
    assert "ok." in capsys.readouterr().out
    bad = load("config/smoke.yaml")
    bad["stats"]["k"] = 7
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    assert cli.main(["check-config", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert "stats.k=7 is not in metrics.ks" in err and "Traceback" not in err
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({**load("config/smoke.yaml"), "extrct": {}}))
    assert cli.main(["check-config", str(tmp_path / "typo.yaml")]) == 2
    assert "extrct" in capsys.readouterr().err


def test_cli_measure_prints_the_coupling_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import tiny_models
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tiny_models.llama(layers=3)
    model.to(dtype=__import__("torch").float32).save_pretrained(tmp_path / "m")
    vocab = {chr(97 + i): i for i in range(26)} | {"[UNK]": 26}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "m")
    from blockcoupling import cli

    # in this process: the worker has torch loaded (the command line's entry point runs in
    # tests/test_fetch.py and CI)
    assert cli.main(["measure", str(tmp_path / "m"), "hello there", "--k", "4"]) == 0
    out = capsys.readouterr()
    assert "3 blocks" in out.out and "p0000" in out.out and "mean" in out.out, out.err[-2000:]
    # a missing model: one line, checked in this process (an exception escaping main fails the
    # test as a traceback would fail the command line)
    assert cli.main(["measure", "no/such/model", "x"]) == 2
    assert "no such path" in capsys.readouterr().err


def test_strings_read_from_files_are_not_written_truncated(tmp_path: Path) -> None:
    """A string coord read back with 8 characters, concatenated with longer ones, is written
    whole (the encoding inherited from the file is dropped)."""
    for name, prompt in (("a", "arc-0001"), ("b", "mmlu-0001")):
        data = xr.Dataset({"lss": ("prompt", [1.0])}, coords={"prompt": np.array([prompt])})
        io.write_netcdf(data, tmp_path / f"{name}.nc")
    parts = [io.read_netcdf(tmp_path / f"{name}.nc") for name in "ab"]
    io.write_netcdf(xr.concat(parts, dim="prompt"), tmp_path / "both.nc")
    back = io.read_netcdf(tmp_path / "both.nc")
    assert list(back["prompt"].values) == ["arc-0001", "mmlu-0001"]
    assert parts[0]["prompt"].encoding  # the inputs keep theirs


def test_a_model_without_token_families_is_left_out_of_the_combined_tokens() -> None:
    """A model with token_families: false writes an empty token file; the combined tokens
    dataset gathers the other models only (its inputs name none of that model's files), and
    there is none when no model has token families."""
    from dataclasses import replace

    config = load("config.yaml")
    config["models"]["gemma3-270m"]["token_families"] = False
    plan = checked(config)
    tokens = plan.combine_inputs("init", "tokens")
    assert tokens and not [f for f in tokens if "/gemma3-270m/" in f]
    assert [f for f in tokens if "/smollm2-135m/" in f]
    assert "results/metrics/gemma3-270m/final/token_coupling.nc" in plan.targets()
    assert "results/metrics/gemma3-270m/final/coupling.nc" in plan.combine_inputs(
        "init", "coupling"
    )
    models = {n: replace(e, token_families=False) for n, e in plan.models.items()}
    assert "tokens" not in replace(plan, models=models).combined_names("init")


def test_a_job_computes_on_its_configured_threads_whatever_cores_it_is_granted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Snakemake lowers a job's threads to --cores on a smaller machine; the numbers of training
    and extraction depend on the thread count, so those jobs keep their configured count."""
    from types import SimpleNamespace

    from blockcoupling.runtime.runner import math_threads

    job = SimpleNamespace(rule="train_x", threads=1, params=SimpleNamespace(math_threads=4))
    with caplog.at_level("INFO"):
        assert math_threads(job) == 4
    assert "computing on 4 threads" in caplog.text and "1 core(s) granted" in caplog.text
    assert math_threads(SimpleNamespace(rule="stats", threads=2, params=SimpleNamespace())) == 2
