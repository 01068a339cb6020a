"""Errors a user can cause come out as one line naming the cause and the fix, never a
traceback: bad devices, non-finite Jacobians, CLI flags, schema errors, a full disk."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, snakemake

from blockcoupling import cli


def save_tiny(folder: Path, poison: float | None = None) -> Path:
    """A 3-block float32 llama with a character tokenizer saved to ``folder``; ``poison``: the
    value written into one weight of block 2's MLP (NaN, inf or a huge number).
    """
    import tiny_models
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tiny_models.llama(layers=3).to(dtype=torch.float32)
    if poison is not None:
        with torch.no_grad():
            model.model.layers[1].mlp.up_proj.weight[0, 0] = poison
    model.save_pretrained(folder)
    vocab = {chr(97 + i): i for i in range(26)} | {"[UNK]": 26}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


@pytest.fixture
def failing(capsys: pytest.CaptureFixture) -> Callable[..., str]:
    """``failing(*argv)``: the CLI's one line on stderr, asserting exit status 2 and nothing
    else on stderr (an uncaught exception fails the test with its traceback).
    """

    def run(*argv: str) -> str:
        capsys.readouterr()  # what came before (e.g. saving the model)
        status = cli.main(list(argv))
        err = capsys.readouterr().err
        bars = re.compile(r"^[\w ]+: .*it/s\]$")  # transformers' loading bar
        lines = [line for line in err.splitlines() if line.strip() and not bars.match(line)]
        assert status == 2 and len(lines) == 1, err[-3000:]
        return lines[0]

    return run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), 1e38])
def test_non_finite_jacobian_is_one_line_naming_model_layer_prompt(
    tmp_path: Path, poison: float, failing: Callable[..., str]
) -> None:
    folder = save_tiny(tmp_path / "m", poison)
    line = failing("measure", str(folder), "hello there", "good day", "--k", "4")
    assert "non-finite Jacobian" in line and "layer 2" in line and "prompt p0000" in line
    assert str(folder) in line and "check the weights" in line


def test_unknown_device_is_one_line(tiny: Path, failing: Callable[..., str]) -> None:
    line = failing("measure", str(tiny), "hello", "--device", "banana")
    assert "--device 'banana'" in line and "cpu" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that sees no CUDA GPU")
def test_cuda_on_a_cpu_only_torch_is_one_line(tiny: Path, failing: Callable[..., str]) -> None:
    line = failing("measure", str(tiny), "hello", "--device", "cuda")
    assert "--device 'cuda'" in line and "--device cpu" in line


def test_measure_errors_name_the_cli_flag(tiny: Path, failing: Callable[..., str]) -> None:
    line = failing("measure", str(tiny), "hello", "--k", "0")
    assert "--k" in line and "extract.k_max" not in line
    line = failing("measure", str(tiny), "hello", "--k", "17")  # hidden size 16
    assert "--k 17" in line and "k_max" not in line


RULE_ON_A_FULL_DISK = """
import logging, types
from blockcoupling.runtime.runner import run_script
sm = types.SimpleNamespace(log=["/dev/full"], threads=1, rule="extract", output=["out.nc"],
                           params=types.SimpleNamespace())
def main(sm):
    for i in range(50):
        logging.info("prompt %d", i)
    with open("/dev/full", "w") as out:  # an output on the same full disk
        out.write("x")
run_script(sm, main)
"""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (ENOSPC on write)")
def test_a_full_disk_is_one_line_per_file_not_a_logging_traceback_per_record() -> None:
    out = subprocess.run(
        [sys.executable, "-c", RULE_ON_A_FULL_DISK], capture_output=True, text=True
    )
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if " INFO prompt " not in line]
    assert lines == [
        "cannot write the log /dev/full: the disk is full (No space left on device); "
        "free space and rerun",
        lines[1],
    ], out.stderr[-3000:]
    assert lines[1].endswith(
        "ERROR extract: writing its outputs (out.nc): the disk is full (No space left on device); "
        "free space and rerun"
    )


SCHEMA_ERRORS = [
    (
        lambda c: c["extract"].update(k_max="abc"),
        "config error: extract.k_max: 'abc' is not of type 'integer' (see config.schema.yaml)",
    ),
    (
        lambda c: c.update(extrct={}),
        "config error: top level: Additional properties are not allowed ('extrct' was "
        "unexpected) (see config.schema.yaml)",
    ),
    (
        lambda c: c["vit"]["model"].update(depth="two"),
        "config error: vit.model.depth: 'two' is not of type 'integer' (see config.schema.yaml)",
    ),
]


@pytest.mark.parametrize(("change", "message"), SCHEMA_ERRORS)
def test_a_schema_error_is_one_line_naming_the_key_path(
    change: Callable[[dict], None], message: str
) -> None:
    from blockcoupling.pipeline.errors import ConfigError
    from blockcoupling.pipeline.schema_check import validate_config

    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    change(config)
    with pytest.raises(ConfigError) as error:
        validate_config(config, REPO / "schemas" / "config.schema.yaml")
    assert f"config error: {error.value}" == message


@pytest.mark.slow
@pytest.mark.parametrize(("change", "message"), SCHEMA_ERRORS[:1])  # each message: above
def test_a_schema_error_stops_snakemake_in_one_line_not_a_schema_dump(
    tmp_path: Path, change: Callable[[dict], None], message: str
) -> None:
    from test_workflow import write_config

    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    change(config)
    write_config(tmp_path, config)
    result = snakemake(tmp_path, "-n")
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode != 0 and lines == [message], lines


def test_a_rule_meeting_a_non_finite_jacobian_fails_in_one_line(tmp_path: Path) -> None:
    """The runner treats it as a user error (one line, exit 1), not a bug (a traceback)."""
    script = f"""
import types
from blockcoupling.jacobians.engine import NonFiniteJacobianError
from blockcoupling.runtime.runner import run_script
sm = types.SimpleNamespace(log=[{str(tmp_path / "extract.log")!r}], threads=1, rule="extract",
                           output=[], params=types.SimpleNamespace())
def main(sm):
    raise NonFiniteJacobianError("model m, prompt p0001, layer 2, t2=3, t1 in [3]")
run_script(sm, main)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-3000:]
    assert "ERROR extract: non-finite Jacobian (NaN/inf) at model m, prompt p0001" in lines[0]
    assert "Traceback" in (tmp_path / "extract.log").read_text()  # kept in the rule's log


RULE_CANCELLED = """
import logging, sys, time, types
from blockcoupling.runtime.runner import run_script
sm = types.SimpleNamespace(log=[sys.argv[1]], threads=1, rule="metrics", output=["out.nc"],
                           params=types.SimpleNamespace())
def main(sm):
    logging.info("started")
    time.sleep(60)
run_script(sm, main)
"""


def cancel(log: Path, **env: str) -> str:
    """Run RULE_CANCELLED as Slurm job 4242 logging to ``log``, send it SIGTERM once its main
    runs (what scancel sends), and return its stderr (its exit status checked).
    """
    import signal
    import time

    def mains() -> int:  # main's "started" lines in the log
        return log.read_text().count(" INFO started\n") if log.exists() else 0

    before = mains()
    job = subprocess.Popen(
        [sys.executable, "-c", RULE_CANCELLED, str(log)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLURM_JOB_ID": "4242", **env},
    )
    for _ in range(200):  # until main runs
        if mains() > before:
            break
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=30)
    assert job.returncode == 128 + signal.SIGTERM
    return err


def test_a_cancelled_job_says_cancelled_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "metrics.log"
    err = cancel(log, BLOCKCOUPLING_SLURM_STATUS="sacct")
    lines = [line for line in err.splitlines() if " ERROR " in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].endswith(
        "ERROR metrics: CANCELLED (SIGTERM to Slurm job 4242: scancel, preemption or its time "
        "limit; `sacct -j 4242` or the Slurm log says which); its outputs are incomplete and "
        "not kept"
    )
    assert "CANCELLED" in log.read_text()  # the rule's log says it too


def test_a_retry_keeps_the_cancelled_line_and_squeue_runs_get_no_sacct_advice(
    tmp_path: Path,
) -> None:
    """A job CANCELLED then run again (Snakemake's retry, same log): the rule's log keeps the
    first attempt's CANCELLED line (it once began afresh, so only the Slurm log had it); where
    the run's status command is squeue (no accounting), the line advises scontrol, not sacct.
    A run after a clean one starts its log afresh."""
    log = tmp_path / "metrics.log"
    first = cancel(log, BLOCKCOUPLING_SLURM_STATUS="squeue")
    assert "sacct" not in first and "`scontrol show job 4242`" in first, first
    cancel(log, BLOCKCOUPLING_SLURM_STATUS="squeue")
    text = log.read_text()
    assert text.count("CANCELLED") == 2 and text.count("started again") == 1, text
    log.write_text("2026-11-27 07:00:00,000 INFO metrics: done\n")  # a clean run before
    cancel(log)
    assert log.read_text().count("CANCELLED") == 1
