"""The pin across real machines: record bench/isa_pin.py's digests here, compare with a record.

Usage:
  python bench/isa_record.py > THIS_MACHINE.json
  python bench/isa_record.py --against OTHER_MACHINE.json [--mine THIS_MACHINE.json]

Runs bench/isa_pin.py's worker (GPT-NeoX and ViT training, GPT-NeoX and Llama extraction,
numpy's float64 loops; each part's SHA-256) pinned (``isa.job_env()``) and native (each
library's own dispatch) at two sizes, the slow test's (``emulated``) and the script's default,
in fresh one-thread processes, and prints them as JSON with this machine's CPU and versions.
With ``--against``, it prints a markdown table: per size, environment and part, whether this
machine's digest equals the recorded one. Torch and numpy must be the same versions on both
machines (a part's bits also change with the library version); the table says which ran.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import isa_pin  # noqa: E402

SIZES = {"emulated": isa_pin.EMULATED_SIZES, "default": []}  # []: the worker's own defaults
ENVIRONMENTS = ("pinned", "native")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def record() -> dict:
    """Digests per size, environment and part, with the machine and versions."""
    import numpy
    import torch

    envs = isa_pin.environments()
    digests = {
        size: {
            name: {
                part: value[0]
                for part, value in isa_pin.run_in(envs[name], args).items()
                if isinstance(value, list)
            }
            for name in ENVIRONMENTS
        }
        for size, args in SIZES.items()
    }
    return {
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "digests": digests,
    }


def compare(mine: dict, other: dict) -> str:
    """Markdown: whether each part's digest is the same on both machines."""
    lines = [
        f"This machine: {mine['cpu']} (torch {mine['torch']}, numpy {mine['numpy']}); "
        f"the record: {other['cpu']} (torch {other['torch']}, numpy {other['numpy']}).",
        "",
        "| size | environment | " + " | ".join(isa_pin.PARTS) + " |",
        "|---|---|" + "---|" * len(isa_pin.PARTS),
    ]
    for size in SIZES:
        for name in ENVIRONMENTS:
            a, b = mine["digests"][size][name], other["digests"][size][name]
            cells = ["identical" if a[p] == b[p] else "differ" for p in isa_pin.PARTS]
            lines.append(f"| {size} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another machine's record (JSON)")
    parser.add_argument("--mine", type=Path, help="this machine's record (default: run now)")
    args = parser.parse_args()
    mine = json.loads(args.mine.read_text()) if args.mine else record()
    if args.against is None:
        print(json.dumps(mine, indent=1))
        return
    print(compare(mine, json.loads(args.against.read_text())))


if __name__ == "__main__":
    main()
