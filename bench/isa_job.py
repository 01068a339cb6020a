"""One real training job of a config's plan, here and on another vendor's CPU: bit for bit?

    python bench/isa_job.py RUN --results RESULTS [--configfile config.yaml] [--emulate]
                            [--out bench/runs/x.md]

Trains the run ``RUN`` of the config's training grids (``Plan.train_runs``, the spec its
``train_<run>`` job gets) as that job does (``lm.training.train.train``, one thread,
the pinned environment ``isa.job_env()`` and OpenBLAS matmul route), in a fresh process, and
compares the SHA-256 of each checkpoint's ``model.safetensors`` with the one the workflow wrote in
``RESULTS/train/RUN/step{N}/``. With ``--emulate`` the process runs under ``qemu-x86_64 -cpu
Haswell`` (bench/isa_pin.py ``EMULATED``: an Intel CPU with AVX2 and no AVX-512, seen through
cpuid by every library), far slower: a 300-step run of the default's fixed-size grid (28 s
here) had not finished after 38 CPU-minutes there. bench/isa_pin.py checks the same on small
runs of every part; this is the default's own job at its own size.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))
from isa_pin import EMULATED, environments  # noqa: E402
from isa_record import cpu_name  # noqa: E402


def run_spec(configfile: Path, run: str) -> dict:
    """The spec the workflow's ``train_<run>`` job gets from ``configfile``."""
    from blockcoupling.pipeline.checks import check_config
    from blockcoupling.pipeline.schema_check import validate_config

    config = yaml.safe_load(configfile.read_text(encoding="utf-8"))
    validate_config(config, REPO / "schemas" / "config.schema.yaml")
    runs = check_config(config, REPO).train_runs
    if run not in runs:
        raise SystemExit(f"{run!r} is not a training run of {configfile}: {', '.join(runs)}")
    return runs[run]


def worker(spec: dict, folder: Path) -> dict[str, str]:
    """Train ``spec`` in ``folder`` as the job does; step -> sha256 of its model.safetensors."""
    import torch

    from blockcoupling.lm.training.train import TrainConfig, train
    from blockcoupling.runtime import blas, isa

    torch.set_num_threads(1)
    blas.route_if_pinned()
    isa.check_job()
    config = TrainConfig(**spec)
    train(config, folder, threads=1, progress=False)
    return {
        str(step): _sha256(folder / f"step{step}" / "model.safetensors") for step in config.steps
    }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "run", nargs="?", help="a training run of the config, e.g. fixed_size-f0.02-wd0.0-s2"
    )
    parser.add_argument("--results", type=Path, help="the workflow's results/ (required)")
    parser.add_argument("--configfile", type=Path, default=REPO / "config.yaml")
    parser.add_argument("--emulate", action="store_true", help="train under QEMU's Haswell")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker[0]), Path(args.worker[1]))))
        return 0
    if args.run is None or args.results is None:
        parser.error("RUN and --results are required")
    spec = run_spec(args.configfile, args.run)
    env = environments()["pinned"]  # the jobs' pin, one thread per math library
    prefix = EMULATED if args.emulate else ()
    with tempfile.TemporaryDirectory() as folder:
        start = time.monotonic()
        done = subprocess.run(
            [*prefix, sys.executable, __file__, "--worker", json.dumps(spec), folder],
            env=env,
            capture_output=True,
            text=True,
        )
        seconds = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"the training failed:\n{done.stderr[-3000:]}")
    digests = json.loads(done.stdout.strip().splitlines()[-1])
    where = "an emulated Intel Haswell (" + " ".join(EMULATED) + ")" if args.emulate else "here"
    lines = [
        f"# `{args.run}` trained {where}, against `{args.results}`",
        "",
        f"`python bench/isa_job.py {args.run} --results {args.results}"
        + (" --emulate`" if args.emulate else "`"),
        f"on {platform.machine()} ({cpu_name()}); {seconds:.0f} s; spec {json.dumps(spec)}",
        "",
        "| step | sha256 here | sha256 in the results | identical |",
        "| --- | --- | --- | --- |",
    ]
    same = True
    for step, digest in digests.items():
        recorded = args.results / "train" / args.run / f"step{step}" / "model.safetensors"
        theirs = _sha256(recorded) if recorded.is_file() else "(missing)"
        same &= digest == theirs
        lines.append(f"| {step} | {digest[:16]} | {theirs[:16]} | {digest == theirs} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
