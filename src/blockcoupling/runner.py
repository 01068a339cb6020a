"""The job side of every rule: run a script's ``main(snakemake)`` with its log, threads and
one-line errors. Imports nothing heavy, so a rule's code hash covers only what its script uses.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blockcoupling import manifest

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)


def run_script(snakemake: Any, main: Callable[[Any], None]) -> None:
    """Run ``main(snakemake)`` logging to the rule's log and stderr, with torch (when the script
    uses it) set to the rule's threads, then record the hash of every output in the results'
    manifest; a user error becomes one line (exit status 1) and its traceback stays in the log.
    """
    log_path = Path(snakemake.log[0]) if len(snakemake.log) else None
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        handlers=handlers,
        force=True,
    )
    torch = sys.modules.get("torch")  # imported by the script's own imports, if it needs it
    if torch is not None:
        torch.set_num_threads(max(1, int(snakemake.threads)))
    try:
        main(snakemake)
        manifest.record(snakemake.output)
    except USER_ERRORS as error:
        logging.error("%s: %s", snakemake.rule, error)
        if log_path is not None:
            with open(log_path, "a") as log:
                traceback.print_exc(file=log)
        sys.exit(1)
    except Exception:  # a bug: the whole traceback, in the rule's log too
        logging.exception("%s failed", snakemake.rule)
        sys.exit(1)
