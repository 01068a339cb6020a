"""One code path for the CPU math libraries, whatever the x86-64 CPU offers.

ATen's vectorized kernels (elementwise ops, reductions, softmax, norms, AdamW), MKL (SVD, QR,
attention's fused kernel), oneDNN (GELU, convolutions) and numpy's OpenBLAS (the matmuls of a
pinned job: ``runtime.blas``) each pick their kernels by the CPU's
instruction set: an AVX-512 machine sums in another order than an AVX2 one, and training
amplifies the last-bit difference into other weights. ``job_env`` pins ATen, oneDNN and OpenBLAS
and numpy's own SIMD loops to their AVX2 (x86-64-v3) code path, which every x86-64 CPU since
2013-2015 runs (Intel Haswell, AMD Excavator/Zen), and MKL to its vendor-independent SSE2
branch; the thread count is each job's ``threads``. The variables must be set before torch and
numpy load: the workflow sets them for every job (rules/common.smk), the
command line before it imports torch. Imports nothing heavy.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

OPT_OUT = "BLOCKCOUPLING_ISA"  # =native: each library's own dispatch (machine-specific numbers)
PINNED: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's vectorized kernels
    # MKL's one branch documented to give the same results on Intel and AMD CPUs alike (SSE2, no
    # approximate reciprocals); on an AMD CPU MKL takes AVX2 or AVX512 as AUTO, its own dispatch
    "MKL_CBWR": "COMPATIBLE",
    "MKL_DYNAMIC": "FALSE",  # MKL's reproducibility also needs a fixed thread count
    "OMP_DYNAMIC": "FALSE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's JIT kernels
    "DNNL_MAX_CPU_ISA": "AVX2",  # its older name
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's OpenBLAS (its AVX2 kernels)
    # numpy's own SIMD loops at x86-64-v3 (AVX2): its AVX-512 float64 exp, log and arctanh give
    # other last bits (numpy 2.x names; unknown names are ignored)
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
}
NEEDED_FLAGS = ("avx2", "fma")  # what the pinned code path executes
# torch ops whose CPU kernels call MKL's vector math (VML), which ignores MKL_CBWR on an AMD CPU
# and picks its code by vendor: on this AMD EPYC and under QEMU's Intel Haswell, pinned, these
# gave other bits (float32 and float64 alike; bench/isa_pin.py --emulate), every other
# elementwise op, norm, softmax and reduction tried the same bits. The library never calls them
# in a job (tests/test_isa.py): square roots go through rsqrt, AdamW through its fused kernel.
VENDOR_DEPENDENT_OPS = frozenset(
    {
        "aten::sqrt",
        "aten::sqrt_",
        "aten::_foreach_sqrt",
        "aten::_foreach_sqrt_",
        "aten::atan",
        "aten::asin",
        "aten::acos",
        "aten::_cdist_forward",
    }
)


class ISAError(ValueError):
    """The pin cannot hold here: the CPU lacks AVX2/FMA, or torch loaded before the pin."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's feature flags from ``cpuinfo`` (Linux), or None where it cannot be read."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return None


def pinned() -> bool:
    """Whether jobs here run the pinned code path: x86-64, no ``BLOCKCOUPLING_ISA=native``."""
    x86_64 = platform.machine().lower() in ("x86_64", "amd64")
    return x86_64 and os.environ.get(OPT_OUT) != "native"


def job_env(flags: set[str] | None = None) -> dict[str, str]:
    """The variables that pin a job's math libraries (empty where ``pinned()`` is False);
    ``ISAError`` when this CPU (``flags``: its features, default /proc/cpuinfo) lacks AVX2/FMA.
    """
    if os.environ.get(OPT_OUT) not in (None, "", "native"):
        raise ISAError(f"{OPT_OUT}={os.environ[OPT_OUT]}: unset it, or set it to native")
    if not pinned():
        return {}
    flags = cpu_flags() if flags is None else flags
    missing = [f for f in NEEDED_FLAGS if flags is not None and f not in flags]
    if missing:
        raise ISAError(
            f"this CPU lacks {'/'.join(m.upper() for m in missing)}, which the pinned AVX2 code "
            f"path of every job needs: set {OPT_OUT}=native to run each library's own code path "
            "(results then differ from other machines' in the last bits, amplified by training)"
        )
    return dict(PINNED)


def pin() -> None:
    """Set ``job_env()`` in this process's environment; call it before torch or numpy loads
    (``ISAError`` if torch already has, unless the environment already held the pin).
    """
    env = job_env()
    if any(os.environ.get(k) != v for k, v in env.items()) and "torch" in sys.modules:
        raise ISAError("torch was imported before blockcoupling.runtime.isa.pin(): pin first")
    os.environ.update(env)


def check_job() -> None:
    """In a job: ``ISAError`` unless its environment holds the pin and torch (when loaded)
    dispatches to AVX2 kernels, so that no job runs unpinned by mistake.
    """
    env = job_env()
    wrong = sorted(k for k, v in env.items() if os.environ.get(k) != v)
    if wrong:
        raise ISAError(
            f"this job's environment does not pin {', '.join(wrong)}: run it through the "
            f"Snakefile (rules/common.smk sets them), or set {OPT_OUT}=native"
        )
    torch = sys.modules.get("torch")
    if env and torch is not None and torch.backends.cpu.get_cpu_capability() != "AVX2":
        raise ISAError(
            f"torch dispatches to {torch.backends.cpu.get_cpu_capability()} kernels, not the "
            "pinned AVX2: ATEN_CPU_CAPABILITY was set after torch loaded"
        )
