"""Inputs that meant something else, or failed late in a traceback, refused in one line naming
the input and the fix before any work: per-run twins sharing a seed, non-finite pilot tables,
rates that are not numbers, claims with the README's markers, datasets of the wrong kind, a
damaged model folder, out-of-range flags, a hub endpoint answering HTML, wrong-type calls of
the public API, a full disk while training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from conftest import REPO, refusal, save_tiny_folder, smoke

import blockcoupling as bc
from blockcoupling import cli

pytestmark = pytest.mark.usefixtures("root_logging")  # rule scripts run in-process


@pytest.fixture
def failing(capsys: pytest.CaptureFixture) -> Callable[..., str]:
    """``failing(*argv)``: the CLI's one line on stderr, asserting exit status 2 and nothing
    else there (an uncaught exception fails the test with its traceback)."""

    def run(*argv: str) -> str:
        capsys.readouterr()
        status = cli.main(list(argv))
        captured = capsys.readouterr()
        lines = [  # a deprecated command's notice aside (blockcoupling power)
            line for line in captured.err.splitlines() if line.strip() and "deprecated" not in line
        ]
        assert status == 2 and len(lines) == 1, (status, captured.err[-3000:])
        return lines[0]

    return run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_folder(tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture(scope="module")
def measured(tiny: Path) -> dict[str, xr.Dataset]:
    """The tiny model's depth dataset (two prompts, K_max 4) and its coupling dataset."""
    model, tokenizer = bc.load_model(str(tiny), device="cpu")
    depth = bc.extract(model, tokenizer, ["hello", "good day"], bc.ExtractConfig(k_max=4))
    coupling = bc.coupling_dataset(depth["depth"], bc.MetricConfig(ks=(2,)))
    return {"model": model, "tokenizer": tokenizer, "depth": depth["depth"], "coupling": coupling}


def never(what: str) -> Callable[..., None]:
    """A stand-in for an expensive step that a refusal must come before."""

    def called(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{what} ran before the refusal")

    return called


# --- config and inputs that meant something else ------------------------------------------


def test_per_run_twins_sharing_a_seed_are_refused_naming_the_runs_and_the_key() -> None:
    config = smoke(random_init={"per_run": True})  # 2 data fractions x seeds 0, 1: 2 twins
    message = refusal(config)
    assert message.startswith("random_init.per_run: training runs fixed_size-f0.5-s0, ")
    assert "fixed_size-f1.0-s0 share seed 0" in message and "key seed" in message
    config["train"]["grids"]["fixed_size"]["axes"] = {"data_fraction": [0.5, 1.0], "seed": [0, 1]}
    config["train"]["grids"]["fixed_size"]["paired"] = True  # one seed per run: accepted
    config["figures"]["token_model"] = "fixed_size-f1.0-s1-final"
    from blockcoupling.pipeline.checks import check_config

    plan = check_config(config, REPO)
    seeds = [e.twin_seed for e in plan.models.values() if e.twin_seed is not None]
    assert sorted(seeds) == [0, 0, 1]  # the emergence suite (no twin) shares seed 0: allowed


def test_a_grid_seed_given_twice_is_refused_not_a_zip_error() -> None:
    config = smoke()
    config["train"]["grids"]["emergence"]["axes"]["seed"] = [0, 0]
    message = refusal(config)
    assert message.startswith("train.grids.emergence.axes: the point {'seed': 0} comes twice")


def test_a_pilot_table_with_a_nan_column_is_refused_naming_the_column(
    tmp_path: Path, failing: Callable[..., str]
) -> None:
    import pandas as pd

    across = pd.read_csv(REPO / "resources" / "pilot_across.csv")
    across["excess_k2"] = np.nan  # power NaN, pilot_n 0, df -1 and rc 0 before
    across.to_csv(tmp_path / "across.csv", index=False)
    line = failing(
        "pilot", "power", "--configfile", str(REPO / "config.yaml"),
        "--within", str(REPO / "resources" / "pilot_within.csv"),
        "--across", str(tmp_path / "across.csv"), "--out", str(tmp_path / "power.csv"),
    )  # fmt: skip
    assert f"{tmp_path / 'across.csv'}: column 'excess_k2' has 12 of 12 values not finite" in line
    assert not (tmp_path / "power.csv").exists()


@pytest.mark.parametrize(
    ("matmul", "message"),
    [
        ("true", "matmul = True is not a number; give FLOP/s"),  # read as 1 FLOP/s before
        ('"2.6e13"', "matmul = '2.6e13' is not a number"),
        ("1e-300", "matmul = 1e-300 is outside 1e+06..1e+18 (FLOP/s)"),
        ("1e300", "matmul = 1e+300 is outside 1e+06..1e+18 (FLOP/s)"),
    ],
)
def test_rates_are_positive_plausible_numbers(tmp_path: Path, matmul: str, message: str) -> None:
    from blockcoupling.pipeline import cost

    record = json.loads(cost.GPU_RATES.read_text())
    text = json.dumps(record).replace(f'"matmul": {record["matmul"]}', f'"matmul": {matmul}')
    path = tmp_path / "rates.json"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        cost.load_rates(path)
    assert str(error.value).startswith(f"{path}: {message}")


def test_a_claims_table_holding_the_readme_markers_is_refused(
    tmp_path: Path, failing: Callable[..., str]
) -> None:
    from blockcoupling.stats.claims import END, START

    (tmp_path / "results" / "stats").mkdir(parents=True)
    (tmp_path / "results" / "stats" / "claims.md").write_text(f"{START}\n| a |\n{END}\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{START}\nold\n{END}\n")
    line = failing("claims", str(tmp_path / "results"), "--readme", str(readme))
    assert "claims.md holds the markers" in line and "stats_claims" in line
    assert readme.read_text() == f"# x\n{START}\nold\n{END}\n"  # one pair, untouched


def test_combine_refuses_a_depth_dataset_among_coupling_ones(measured: dict) -> None:
    parts = {("a", "final"): measured["coupling"], ("b", "final"): measured["depth"]}
    with pytest.raises(TypeError, match=r"combine\(parts\[\('b', 'final'\)\]\): expected a "):
        bc.combine(parts, "coupling", "init", {})
    with pytest.raises(ValueError, match="step 'final' of 'a' along 'step': expected a checkpoint"):
        bc.combine({("a", "final"): measured["coupling"]}, "coupling", "step", {})
    assert (
        bc.combine({("a", "final"): measured["coupling"]}, "coupling", "init", {}).sizes["model"]
        == 1
    )


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_coupling_dataset_names_non_finite_singular_values(measured: dict, bad: float) -> None:
    depth = measured["depth"].copy(deep=True)
    depth["singular_values"][1, 1, 0] = bad  # was: NaN excess for that prompt, without a word
    with pytest.raises(ValueError) as error:
        bc.coupling_dataset(depth, bc.MetricConfig(ks=(2,)))
    assert f"singular_values is {bad} at prompt=p0001, layer=2, rank=0" in str(error.value)


def test_inf_in_a_depth_file_is_reported_as_non_finite_not_as_a_low_rank(
    measured: dict, tmp_path: Path
) -> None:
    from blockcoupling.files.metric_files import write_metrics

    depth = measured["depth"].copy(deep=True)
    depth["singular_values"][0, 1, 0] = np.inf
    bc.write_netcdf(depth, tmp_path / "depth.nc")
    bc.write_netcdf(xr.Dataset(), tmp_path / "tokens.nc")
    with pytest.raises(ValueError) as error:
        write_metrics(
            str(tmp_path / "depth.nc"), str(tmp_path / "tokens.nc"), bc.MetricConfig(ks=(2,)),
            str(tmp_path / "c.nc"), str(tmp_path / "t.nc"), "model m, step final",
        )  # fmt: skip
    assert "singular_values is inf" in str(error.value) and "rank below" not in str(error.value)


# --- one line, before the expensive step --------------------------------------------------


def test_a_prompt_that_is_not_utf8_is_one_line(
    tiny: Path, failing: Callable[..., str], measured: dict
) -> None:
    text = os.fsdecode(b"a\xffb")  # what a shell passes for a Latin-1 byte in argv
    line = failing("measure", str(tiny), "hello", text, "--k", "2")
    assert line.startswith("blockcoupling measure: PROMPT 2 is not UTF-8 text (byte b'\\xff'")
    with pytest.raises(ValueError, match="prompt 0: not UTF-8 text"):
        bc.extract(measured["model"], measured["tokenizer"], [text])


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (
            lambda m: (m / "tokenizer.json").write_text('{"version": '),
            "tokenizer.json is not valid",
        ),
        (lambda m: (m / "model.safetensors").write_bytes(b""), "model.safetensors is empty"),
        (
            lambda m: (m / "model.safetensors").write_bytes(
                (m / "model.safetensors").read_bytes()[:100]
            ),
            "model.safetensors is truncated or not safetensors",
        ),
        (
            lambda m: (m / "model.safetensors").write_bytes(
                (m / "model.safetensors").read_bytes()[:-10]
            ),
            "model.safetensors is truncated: its tensors need",
        ),
    ],
)
def test_a_damaged_model_folder_is_one_line_naming_the_file(
    tmp_path: Path, tiny: Path, damage: Callable[[Path], object], said: str,
    failing: Callable[..., str],
) -> None:  # fmt: skip
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny, folder)
    damage(folder)
    for twin in ([], ["--random-twin"]):
        line = failing("measure", str(folder), "hello", "--k", "2", *twin)
        assert f"{folder}/{said}" in line and "fetch or save the model again" in line


def test_threads_beyond_the_cpus_are_refused_before_torch_loads(tiny: Path) -> None:
    """In a process of its own: 100000 torch threads would wreck the test's process."""
    out = subprocess.run(
        [sys.executable, "-m", "blockcoupling.cli", "measure", str(tiny), "hi", "--threads",
         "100000"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("blockcoupling measure: --threads 100000: give 1 to ")


def test_a_twin_seed_beyond_int64_is_refused_before_loading(
    tiny: Path, failing: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from blockcoupling import api

    monkeypatch.setattr(api, "load_random_twin", never("loading the twin"))
    line = failing("measure", str(tiny), "hi", "--random-twin", "--seed", str(2**70))
    assert line == f"blockcoupling measure: --seed {2**70}: give a seed from 0 to 2**63-1"
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"random_twin\(seed=...\): 1180591620717411303424 is"):
        bc.load_random_twin(str(tiny), seed=2**70)


def test_out_onto_an_existing_folder_fails_before_measuring(
    tmp_path: Path, tiny: Path, failing: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from blockcoupling import api

    monkeypatch.setattr(api, "load_model", never("loading the model"))
    (tmp_path / "m.nc").mkdir()
    line = failing("measure", str(tiny), "hi", "--out", str(tmp_path / "m.nc"))
    assert f"--out {tmp_path / 'm.nc'} is a folder" in line


def test_a_dotted_package_name_is_refused_without_importing_anything(
    failing: Callable[..., str],
) -> None:
    sys.modules.pop("this", None)  # finding this.x imported this (it prints the Zen of Python)
    line = failing("measure", "package:this.x:f.gguf", "hi")
    assert "package 'this.x' is not a top-level package name" in line
    assert "this" not in sys.modules
    with pytest.raises(ValueError, match="package 'this.x' is not a top-level package name"):
        bc.load_model("package:this.x:f.gguf")
    assert "this" not in sys.modules


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("stats: {primary: [\n", "YAML error at line 2, column 1: expected the node content"),
        ("stats: {k: 2}\n", "no stats.primary tests declared"),
        ("[" * 5000 + "]" * 5000 + "\n", "nested too deeply to parse"),
    ],
)
def test_pilot_power_with_a_bad_config_is_one_line(
    tmp_path: Path, config: str, said: str, failing: Callable[..., str]
) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(config)
    line = failing("pilot", "power", "--configfile", str(file), "--out", str(tmp_path / "p.csv"))
    assert line.startswith(f"blockcoupling pilot: {file}: {said}")
    if "nested" in said:
        line = failing("check-config", str(file), "--workflow-dir", str(REPO))
        assert line.startswith(f"blockcoupling check-config: {file}: {said}")


@pytest.mark.parametrize("table", ["pilot_within.csv", "power.csv"])
def test_power_on_a_table_other_than_an_analysis_table_is_one_line(
    tmp_path: Path, table: str, failing: Callable[..., str]
) -> None:
    """A pilot table was a KeyError traceback; the power table gave NaN powers, rc 0."""
    path = REPO / "resources" / table
    out = tmp_path / "p.csv"
    line = failing("power", str(path), "--configfile", str(REPO / "config.yaml"), "--out", str(out))
    assert f"{path}: no column(s) " in line and "not an analysis table" in line
    assert not out.exists()


def test_pilot_refuses_an_out_in_a_missing_folder_before_training(
    tmp_path: Path, failing: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from blockcoupling.lm.training import train

    monkeypatch.setattr(train, "train", never("training"))
    out = tmp_path / "missing" / "a.csv"
    line = failing("pilot", "across", "--out", str(out))
    assert line.startswith(f"blockcoupling pilot: --out {out}: name a .csv file in an existing")
    line = failing("pilot", "within", "--seeds", "100", "100", "--out", str(tmp_path / "w.csv"))
    assert "--seeds 100 100: a seed comes twice" in line


class HTMLPage(BaseHTTPRequestHandler):
    """A web server's page where the hub API was expected."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"<!doctype html><html><body>Welcome</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


def test_a_hub_endpoint_answering_html_is_one_line_naming_it(tmp_path: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), HTMLPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        out = subprocess.run(
            [sys.executable, "-m", "blockcoupling.cli", "fetch", "org/m", "main",
             str(tmp_path / "cache" / "models" / "org" / "m" / "main")],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"),
                 "PYTHONPATH": str(REPO / "src")},
        )  # fmt: skip
    finally:
        server.shutdown()
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert f"the hub endpoint {endpoint} answered the API call for org/m" in lines[0]
    assert "not JSON" in lines[0] and "HF_ENDPOINT" in lines[0]


# --- the public API's argument types ------------------------------------------------------

WRONG_CALLS = [  # (call, the message's start): each was a traceback deep inside, or wrong
    (lambda d: bc.load_model(None), "source: expected str or Mapping or ModelSource, got None"),
    (lambda d: bc.load_model(str(d["tiny"]), dtype=32), "dtype (e.g. 'float32'): expected str"),
    (
        lambda d: bc.load_random_twin(str(d["tiny"]), seed="1"),
        "load_random_twin(seed=...): expected int",
    ),
    (lambda d: bc.extract(d["model"], d["tokenizer"], "a string"), "prompts: expected a list"),
    (lambda d: bc.extract(None, d["tokenizer"], ["a"]), "extract(model=...): expected Module"),
    (lambda d: bc.extract(d["model"], d["tokenizer"], ["a"], {"k_max": 2}), "extract(config="),
    (lambda d: bc.ExtractConfig(k_max="5"), "ExtractConfig(k_max=...): expected int, got str"),
    (lambda d: bc.ExtractConfig(variants="ujv"), "ExtractConfig(variants=...): expected a tuple"),
    (lambda d: bc.MetricConfig(ks=10), "MetricConfig(ks=...): expected a list of ints"),
    (lambda d: bc.Selection(k="10"), "Selection(k=...): expected an int or None, got '10'"),
    (lambda d: bc.Selection(reading=3), "Selection(reading=...): expected a str, got 3"),
    (lambda d: bc.coupling_dataset(d["coupling"]), "coupling_dataset(depth=...): expected a depth"),
    (
        lambda d: bc.prompt_table(d["depth"], bc.Selection(k=2)),
        "prompt_table(coupling=...): expected a coupling dataset",
    ),
    (
        lambda d: bc.calibration_table(d["coupling"], [2], bc.Selection(k=2)),
        "calibration_table(coupling=...): expected a combined coupling dataset",
    ),
    (lambda d: bc.combine({("a", "final"): d["coupling"]}, 5, "init", {}), "combine(name=...)"),
    (lambda d: bc.read_netcdf(None), "read_netcdf(path=...): expected str or PathLike"),
    (lambda d: bc.write_netcdf("x", "y.nc"), "write_netcdf(dataset=...): expected Dataset"),
    (lambda d: bc.verify(None), "verify(root=...): expected str or PathLike, got NoneType"),
]


@pytest.mark.parametrize(("call", "said"), WRONG_CALLS, ids=[s[:24] for _, s in WRONG_CALLS])
def test_the_public_api_says_what_it_expected(
    call: Callable[[dict], object], said: str, measured: dict, tiny: Path
) -> None:
    with pytest.raises(TypeError) as error:
        call({**measured, "tiny": tiny})
    assert str(error.value).startswith(said) and "\n" not in str(error.value)


# --- a full disk while training -----------------------------------------------------------


def test_a_full_disk_while_saving_a_checkpoint_is_one_oserror_naming_the_folder(
    small_tmpfs: Callable[[str], Path],
) -> None:
    """On a 96 KiB tmpfs (conftest's ``small_tmpfs``): the tokenizer fits, step 0's weights do
    not; safetensors' own error was a traceback."""
    import errno

    from blockcoupling.lm.training.train import TrainConfig, train
    from blockcoupling.runtime.runner import reason

    folder = small_tmpfs("96k")
    cfg = TrainConfig(
        n_layers=2, d_model=32, n_heads=2, vocab_size=300, context_length=64, batch_size=4,
        total_steps=4, checkpoint_steps=(0, 4), n_val_windows=2, max_train_chars=20000,
    )  # fmt: skip
    with pytest.raises(OSError) as error:
        train(cfg, folder / "run", threads=1, progress=False)
    assert error.value.errno == errno.ENOSPC
    assert error.value.filename == str(folder / "run" / "step0.tmp")
    assert reason(error.value).startswith("the disk is full (No space left on device")
    assert not (folder / "run" / "step0.tmp").exists()  # no partial checkpoint left


def test_a_safetensors_disk_full_error_becomes_an_enospc_oserror(tmp_path: Path) -> None:
    """Without mounting: the words safetensors uses for ENOSPC, and torch's bare writer error
    where the folder's disk has no room for the checkpoint."""
    from safetensors import SafetensorError

    from blockcoupling.lm.training.checkpoints import disk_full

    said = SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    )
    full = disk_full(said, tmp_path / "step4.tmp", needed=10)
    assert full is not None and full.errno == 28 and full.filename == str(tmp_path / "step4.tmp")
    opaque = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert disk_full(opaque, tmp_path / "step4.tmp", needed=10) is None  # room: another error
    assert disk_full(opaque, tmp_path / "step4.tmp", needed=1 << 62) is not None
