"""The instruction-set pin (blockcoupling.runtime.isa): its checks, and that pinned training and
extraction give bit-identical numbers when the libraries are told the CPU stops at AVX2, while
unpinned ones do not (bench/isa_pin.py runs them in fresh processes)."""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

import pytest

from blockcoupling.runtime import isa

BENCH = Path(__file__).resolve().parents[1] / "bench" / "isa_pin.py"
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


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("isa_pin", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["isa_pin"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["isa_pin"]


SIZES = ["--steps=24", "--d-model=32", "--layers=2", "--width=128"]


@x86_only
@pytest.mark.slow
def test_pinned_training_and_extraction_are_identical_on_an_avx2_cpu(bench) -> None:
    envs = bench.environments()
    full = bench.run_in(envs["pinned"], SIZES)
    avx2 = bench.run_in(envs["pinned_avx2_cpu"], SIZES)
    assert full["capability"] == avx2["capability"] == "AVX2"
    for part in bench.PARTS:  # GPT-NeoX and ViT weights; Jacobians and their SVDs
        assert full[part][0] == avx2[part][0], part


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
