"""The instruction-set pin (blockcoupling.runtime.isa): its checks, and that pinned training and
extraction give bit-identical numbers when the libraries are told the CPU stops at AVX2, while
unpinned ones do not (bench/isa_pin.py runs them in fresh processes)."""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_bench
from tiny_models import ARCHITECTURES, CharTokenizer
from torch.utils._python_dispatch import TorchDispatchMode

from blockcoupling.jacobians.extract import extract
from blockcoupling.jacobians.options import ExtractConfig, SVDOptions
from blockcoupling.lm.training.schedule import TrainConfig
from blockcoupling.lm.training.train import train
from blockcoupling.runtime import isa
from blockcoupling.vit import data as vision_data
from blockcoupling.vit.config import ViTRunConfig
from blockcoupling.vit.train import train_vit

EMULATOR = "qemu-x86_64"  # bench/isa_pin.py EMULATED; Debian: apt-get install qemu-user
# set to 1: the pinned runs are compared with an emulated Intel Haswell (QEMU, ~50 s of CPU; .ci/run
# runs it as a stage of its own after the suite); unset: with this CPU capped at AVX2
EMULATE = os.environ.get("BLOCKCOUPLING_TEST_EMULATE") == "1"
X86_64 = platform.machine().lower() in ("x86_64", "amd64")
x86_only = pytest.mark.skipif(not X86_64, reason="the pin is for x86-64 CPUs")


@x86_only
def test_an_avx2_cpu_gets_every_library_pinned(monkeypatch) -> None:
    monkeypatch.delenv(isa.OPT_OUT, raising=False)
    env = isa.job_env({"sse2", "avx", "avx2", "fma"})
    assert env == isa.PINNED
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["MKL_CBWR"] == "COMPATIBLE"


@x86_only
def test_a_cpu_without_avx2_stops_with_one_line_naming_the_way_out(monkeypatch) -> None:
    monkeypatch.delenv(isa.OPT_OUT, raising=False)
    with pytest.raises(isa.ISAError, match=r"lacks AVX2/FMA.*BLOCKCOUPLING_ISA=native") as error:
        isa.job_env({"sse2", "sse4_2", "avx"})
    assert "\n" not in str(error.value)
    monkeypatch.setenv(isa.OPT_OUT, "native")
    assert isa.job_env({"sse2"}) == {}  # opted out: each library's own dispatch
    monkeypatch.setenv(isa.OPT_OUT, "avx512")
    with pytest.raises(isa.ISAError, match="BLOCKCOUPLING_ISA=avx512: unset it"):
        isa.job_env()


def test_cpu_flags_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    assert isa.cpu_flags(cpuinfo) == {"fpu", "sse2", "avx2", "fma"}
    assert isa.cpu_flags(tmp_path / "missing") is None


@x86_only
def test_a_job_without_the_pin_is_refused(monkeypatch) -> None:
    monkeypatch.delenv(isa.OPT_OUT, raising=False)
    isa.check_job()  # the test session runs pinned (conftest), as every job does
    monkeypatch.delenv("MKL_CBWR")
    with pytest.raises(isa.ISAError, match="does not pin MKL_CBWR: run it through the Snakefile"):
        isa.check_job()
    with pytest.raises(isa.ISAError, match="torch was imported before"):
        isa.pin()  # too late: torch is loaded


class _OpNames(TorchDispatchMode):
    """The name of every ATen op run while active (``aten::sqrt``)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func._schema.name)
        return func(*args, **(kwargs or {}))


def test_training_and_extraction_call_no_op_whose_kernel_picks_its_code_by_vendor(
    tmp_path: Path,
) -> None:
    """The ops of isa.VENDOR_DEPENDENT_OPS (MKL's vector math, which ignores MKL_CBWR on an AMD
    CPU) never run in the library's training (GPT-NeoX, ViT) or extraction (composed J_tt,
    token families, randomized top-K): the check across vendors (bench/isa_pin.py --emulate)
    needs QEMU, this one runs anywhere."""
    lm = TrainConfig(
        n_layers=2,
        d_model=16,
        n_heads=2,
        context_length=16,
        batch_size=2,
        total_steps=2,
        vocab_size=280,
        checkpoint_steps=[0, 2],
        n_val_windows=2,
        max_train_chars=5000,
    )
    vit = ViTRunConfig(
        embed_dim=8, depth=2, num_heads=2, patch_size=4, epochs=1, warmup_epochs=0, batch_size=512
    )
    options = ExtractConfig(
        k_max=4, token_layers=(-1,), token_prompts=1, svd=SVDOptions(method="topk", oversample=2)
    )
    with _OpNames() as seen:
        train(lm, tmp_path / "lm", progress=False, threads=1)
        train_vit(vit, vision_data.digits(0), tmp_path / "vit", threads=1, progress=False)
        extract(
            ARCHITECTURES["llama"](torch.float32),
            CharTokenizer(),
            ["hello there"],
            options,
            progress=False,
        )
    assert {"aten::_fused_adamw_", "aten::convolution", "aten::linalg_qr"} <= seen.names
    assert not seen.names & isa.VENDOR_DEPENDENT_OPS
    with _OpNames() as seen:  # what the check catches: PyTorch's default AdamW on CPU
        weight = torch.nn.Parameter(torch.ones(3))
        weight.sum().backward()
        torch.optim.AdamW([weight]).step()
    assert seen.names & isa.VENDOR_DEPENDENT_OPS


@pytest.fixture(scope="module")
def bench():
    yield load_bench("isa_pin")
    del sys.modules["isa_pin"]


SIZES = ["--steps=24", "--d-model=32", "--layers=2", "--width=128"]


@x86_only
@pytest.mark.slow
def test_pinned_training_and_extraction_are_identical_on_an_avx2_cpu(bench) -> None:
    """The same runs pinned, here and on an AVX2-only CPU: with BLOCKCOUPLING_TEST_EMULATE=1, an
    emulated Intel Haswell (another vendor than an AMD host, AVX2 only, its own cache sizes, exact
    reciprocals; every library sees it through cpuid: before the fused AdamW, training differed
    after its first step, isa.VENDOR_DEPENDENT_OPS); else this CPU with every library told it
    stops at AVX2 (the caps of bench/isa_pin.py AVX2_CPU)."""
    envs = bench.environments()
    if EMULATE:
        if not shutil.which(EMULATOR):
            pytest.fail(f"BLOCKCOUPLING_TEST_EMULATE=1 needs {EMULATOR}: apt-get install qemu-user")
        here = bench.run_in(envs["pinned"], bench.EMULATED_SIZES)
        avx2 = bench.run_in(envs["pinned"], bench.EMULATED_SIZES, bench.EMULATED)
    else:
        here = bench.run_in(envs["pinned"], SIZES)
        avx2 = bench.run_in(envs["pinned_avx2_cpu"], SIZES)
    assert here["capability"] == avx2["capability"] == "AVX2"
    for part in bench.PARTS:  # GPT-NeoX and ViT weights; Jacobians and their SVDs
        assert here[part][0] == avx2[part][0], part


@x86_only
@pytest.mark.slow
@pytest.mark.skipif(
    "avx512f" not in (isa.cpu_flags() or set()), reason="needs a CPU beyond AVX2 to differ"
)
def test_unpinned_runs_differ_on_an_avx2_cpu(bench) -> None:
    """What the pin prevents, so that the test above can fail: on this AVX-512 CPU, the same
    runs unpinned give other weights and Jacobians when the libraries are capped at AVX2."""
    envs = bench.environments()
    full = bench.run_in(envs["native"], SIZES)
    avx2 = bench.run_in(envs["native_avx2_cpu"], SIZES)
    assert full["capability"] != "AVX2" and avx2["capability"] == "AVX2"
    for part in bench.PARTS:
        assert full[part][0] != avx2[part][0], part
