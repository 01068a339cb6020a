"""The job side of every rule: run a script's ``main(snakemake)`` with its log, threads and
one-line errors (a cancelled job says CANCELLED). Imports nothing heavy, so a rule's code hash
covers only what its script uses.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from blockcoupling.files import manifest
from blockcoupling.runtime import blas, isa

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)


class LogFile(logging.FileHandler):
    """The rule's log file. A failed write (a full disk, a vanished folder) is reported once,
    as one line on stderr naming the file, and the file is skipped from then on (logging's own
    handler prints a traceback per record: hundreds of lines).
    """

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record unless an earlier write failed."""
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        """An OSError: one line on stderr, the file skipped from now on; else logging's own."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        self.failed = True
        print(f"cannot write the log {self.baseFilename}: {reason(error)}", file=sys.stderr)


def reason(error: OSError) -> str:
    """An OSError in words, with the remedy when the disk is full."""
    if error.errno == errno.ENOSPC:
        return f"the disk is full ({error.strerror}); free space and rerun"
    return str(error)


_ERRNO = re.compile(r"\[Errno (\d+)\] ([^:]+)")


def first_copy_error(error: shutil.Error) -> OSError:
    """The first failure of a ``shutil.copytree`` as an OSError on its target (its errno read
    back from the text copytree kept), instead of the list of every file's failure.
    """
    failures = error.args[0] if error.args and isinstance(error.args[0], list) else []
    if not failures or len(failures[0]) != 3:
        return error
    source, target, why = failures[0]
    found = _ERRNO.search(str(why))
    if found is None:
        return OSError(f"copying {source} to {target}: {why}")
    return OSError(int(found.group(1)), found.group(2), str(target))


CANCELLED_STATUS = 128 + signal.SIGTERM  # a shell's status of a job ended by SIGTERM


def cancelled(rule: str) -> Callable[[int, Any], None]:
    """A SIGTERM handler that says, in one line, that the job was CANCELLED (Slurm sends
    SIGTERM on scancel, preemption and the time limit) and ends it with ``CANCELLED_STATUS``.
    """

    def handler(signum: int, frame: Any) -> None:
        logging.error(
            "%s: CANCELLED (%s); its outputs are incomplete and not kept",
            rule,
            cancel_cause(os.environ),
        )
        sys.exit(CANCELLED_STATUS)

    return handler


def cancel_cause(environ: Mapping[str, str]) -> str:
    """Who sends a job SIGTERM, and how to tell which: ``sacct`` where the run's status command
    is sacct, else (``BLOCKCOUPLING_SLURM_STATUS=squeue``: no accounting database, which the
    workflow exports to its jobs) ``scontrol show job`` while Slurm still lists the job.
    """
    job = environ.get("SLURM_JOB_ID")
    if not job:
        return "SIGTERM to the job: Snakemake stopped, or a kill"
    if environ.get("BLOCKCOUPLING_SLURM_STATUS") == "squeue":
        ask = f"`scontrol show job {job}` (minutes after its end) or the Slurm log"
    else:
        ask = f"`sacct -j {job}` or the Slurm log"
    return f"SIGTERM to Slurm job {job}: scancel, preemption or its time limit; {ask} says which"


_RECORD = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (\w+) ")


def log_mode(path: Path) -> str:
    """How a job opens its rule's log: 'a' where the log's last record is an ERROR (an attempt
    before this one failed or was CANCELLED: its retry keeps why), else 'w' (a fresh run).
    """
    try:
        if not path.is_file():  # none yet, or a device (/dev/full: endless)
            return "w"
        with open(path, "rb") as log:
            log.seek(max(0, path.stat().st_size - 65536))
            tail = log.read(65536).decode("utf-8", errors="replace")
    except OSError:
        return "w"
    levels = [m.group(1) for line in tail.splitlines() if (m := _RECORD.match(line))]
    return "a" if levels and levels[-1] == "ERROR" else "w"


def math_threads(snakemake: Any) -> int:
    """The threads a job computes with: its rule's ``math_threads`` param (the configured
    ``threads`` of a job whose numbers depend on it: training, extraction, evaluation, the ViT
    jobs), whatever cores Snakemake granted (it lowers ``threads`` to ``--cores`` on a smaller
    machine, which would change the numbers, so the job oversubscribes instead, said in its
    log); else the granted threads.
    """
    granted = max(1, int(snakemake.threads))
    wanted = getattr(snakemake.params, "math_threads", None)
    if wanted is None:
        return granted
    if int(wanted) > granted:
        logging.info(
            "%s: computing on %d threads (its configured threads, which its numbers depend on) "
            "with %d core(s) granted",
            snakemake.rule,
            int(wanted),
            granted,
        )
    return int(wanted)


def input_files(snakemake: Any) -> list[str]:
    """The paths of a job's inputs: Snakemake's list of them (a job given its named inputs as
    a plain namespace, or none, alike).
    """
    given = getattr(snakemake, "input", ())
    values = vars(given).values() if isinstance(given, SimpleNamespace) else given
    found: list[str] = []
    for value in values:
        found += [str(value)] if isinstance(value, str | os.PathLike) else map(str, value)
    return found


def run_script(snakemake: Any, main: Callable[[Any], None]) -> None:
    """Run ``main(snakemake)`` logging to the rule's log and stderr, with torch (when the script
    uses it) set to the rule's threads, its matmuls on OpenBLAS (``blas.route_if_pinned``) and
    its math libraries checked to be on the pinned code path (``isa.check_job``) and every
    recorded input compared with its record (``manifest.check_inputs``), then record the hash
    of every output in the results' manifest; a user error becomes one line (exit
    status 1) and its traceback stays in the log.
    """
    log_path = Path(snakemake.log[0]) if len(snakemake.log) else None
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    retry = False
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        retry = log_mode(log_path) == "a"
        handlers.append(LogFile(log_path, mode="a" if retry else "w"))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        handlers=handlers,
        force=True,
    )
    if retry:
        logging.info(
            "%s: started again; the attempt before this one ended as above", snakemake.rule
        )
    signal.signal(signal.SIGTERM, cancelled(snakemake.rule))
    threads = math_threads(snakemake)
    torch = sys.modules.get("torch")  # imported by the script's own imports, if it needs it
    if torch is not None:
        torch.set_num_threads(threads)
        blas.route_if_pinned()
    if "numpy" in sys.modules:  # numpy's BLAS (OpenBLAS) on as many, not on every core here
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads, user_api="blas")
    try:
        isa.check_job()
        started = time.process_time()
        count, size = manifest.check_inputs(input_files(snakemake))
        if count:
            logging.info(
                "%s: %d recorded inputs (%.1f MB) match their records (%.3f CPU s)",
                snakemake.rule,
                count,
                size / 1e6,
                time.process_time() - started,
            )
        main(snakemake)
        manifest.record(snakemake.output, snakemake.rule)
    except USER_ERRORS as error:
        if isinstance(error, shutil.Error):  # copytree's list of (source, target, why) tuples
            error = first_copy_error(error)
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            files = error.filename or f"its outputs ({', '.join(map(str, snakemake.output))})"
            logging.error("%s: writing %s: %s", snakemake.rule, files, reason(error))
        else:
            logging.error("%s: %s", snakemake.rule, error)
        if log_path is not None:
            try:
                with open(log_path, "a") as log:
                    traceback.print_exc(file=log)
            except OSError:  # the log's own failure is already reported
                pass
        sys.exit(1)
    except Exception:  # a bug: the whole traceback, in the rule's log too
        logging.exception("%s failed", snakemake.rule)
        sys.exit(1)
