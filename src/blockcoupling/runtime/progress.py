"""Progress of long steps: a tqdm bar on a terminal, a log line per item elsewhere.

A bar redraws itself with carriage returns; written into a rule's log file that becomes
thousands of frames. So the bar is shown only when stderr is a terminal; otherwise every item
(prompt, checkpoint, batch) gets one ``logging`` line, at most one per ``min_interval`` seconds.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
log = logging.getLogger("blockcoupling")


def on_terminal() -> bool:
    """Whether stderr is an interactive terminal (where a bar redraws in place)."""
    return sys.stderr.isatty()


def track(
    items: Iterable[T],
    total: int,
    desc: str,
    label: Callable[[T], str] = str,
    enabled: bool = True,
    min_interval: float = 10.0,
) -> Iterator[T]:
    """Yield ``items``, reporting progress: a bar on a terminal, else a log line per item
    (``desc: i/total label, elapsed s``; the first and last always, others at most every
    ``min_interval`` seconds). ``enabled=False``: silent.
    """
    if not enabled:
        yield from items
        return
    if on_terminal():
        with tqdm(total=total, desc=desc, unit="item") as bar:
            for item in items:
                bar.set_postfix_str(label(item))
                yield item
                bar.update(1)
        return
    start = last = time.perf_counter()
    for i, item in enumerate(items, start=1):
        yield item
        now = time.perf_counter()
        if i in (1, total) or now - last >= min_interval:
            log.info("%s: %d/%d %s, %.1f s", desc, i, total, label(item), now - start)
            last = now
