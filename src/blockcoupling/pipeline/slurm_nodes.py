"""What a Slurm partition's nodes offer, from ``sinfo`` (torch-free): the most CPUs, memory and
GPUs of one node and the partition's time limit (``Nodes``, ``read_nodes``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

# sinfo -N: one line per node and partition; %P ends in * for the default partition.
SINFO_FORMAT = "%P|%c|%m|%G|%l"


class SlurmError(ValueError):
    """A setting or a job that cannot work on this cluster; the message names the fix."""


@dataclass(frozen=True)
class Nodes:
    """The most one node of a partition offers (CPUs, memory in MB, GPUs) and the partition's
    time limit (minutes; None: unlimited).
    """

    partition: str
    cpus: int
    mem_mb: int
    gpus: int
    time_limit: int | None


def parse_sinfo(text: str, partition: str = "") -> Nodes | None:
    """``Nodes`` of ``partition`` ('': the default one) from ``sinfo -h -N -o SINFO_FORMAT``;
    None if it lists no node of that partition.
    """
    rows = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5:
            continue
        name, cpus, mem, gres, limit = fields
        if (name.rstrip("*") == partition) if partition else name.endswith("*"):
            rows.append((name.rstrip("*"), int(cpus), int(mem.rstrip("+")), gpus_in(gres), limit))
    if not rows:
        return None
    return Nodes(
        partition=rows[0][0],
        cpus=max(row[1] for row in rows),
        mem_mb=max(row[2] for row in rows),
        gpus=max(row[3] for row in rows),
        time_limit=minutes(rows[0][4]),
    )


def gpus_in(gres: str) -> int:
    """GPUs in a node's gres (``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:a:2,gpu:b:2``, ``(null)``)."""
    total = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).strip().split(":")
        if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


_LIMIT = re.compile(r"(?:(\d+)-)?(\d+(?::\d+){0,2})")


def minutes(limit: str) -> int | None:
    """A Slurm time limit (``infinite``, ``30``, ``1:30:00``, ``2-00:00:00``) in minutes;
    ValueError for one that is not of those forms or not above zero (``-5``, ``-1-00:00:00``).
    """
    text = limit.strip()
    if text.lower() in ("infinite", "unlimited", "n/a", ""):
        return None
    match = _LIMIT.fullmatch(text)
    if match is None:
        raise ValueError(f"time limit {limit!r} is not minutes, MM:SS, HH:MM:SS or D-HH:MM:SS")
    days, clock = match.group(1), match.group(2)
    parts = [int(part) for part in clock.split(":")]
    hours, mins, secs = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    total = int(days or 0) * 1440 + hours * 60 + mins + (secs > 0)
    if total <= 0:
        raise ValueError(f"time limit {limit!r} is not above zero")
    return total


def read_nodes(partition: str) -> Nodes | None:
    """What ``partition``'s nodes offer ('': the default partition), from ``sinfo``; None where
    sinfo is missing or fails; ``SlurmError`` where sinfo answers but lists no such partition.
    """
    text = run_slurm_command(["sinfo", "-h", "-N", "-o", SINFO_FORMAT])
    if not text:
        return None
    nodes = parse_sinfo(text, partition)
    if nodes is None:
        names = sorted(
            {line.split("|")[0].rstrip("*") for line in text.splitlines() if "|" in line}
        )
        what = f"no partition {partition!r}" if partition else "no default partition"
        raise SlurmError(f"sinfo lists {what} (partitions: {', '.join(names) or 'none'})")
    return nodes


TIMEOUT_S = 10


def run_slurm_command(command: list[str]) -> str | None:
    """A command's output, or None if it is missing, fails or hangs (a hang is said in one line
    on stderr: the Slurm controller does not answer).
    """
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT_S, check=True
        )
    except subprocess.TimeoutExpired:
        print(
            f"slurm: `{' '.join(command[:3])}` got no answer in {TIMEOUT_S} s: the Slurm "
            "controller does not answer (is slurmctld up?); going on without what it would say",
            file=sys.stderr,
        )
        return None
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout
