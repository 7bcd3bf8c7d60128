"""Progress of long loops: a bar for a person at a terminal, a line per step with an ETA in logs.

Why two forms: a tqdm bar is the right feedback in a terminal, but in the log of
a batch job (stderr redirected to a file) it is either nothing or a wall of
carriage returns. There, one ``logging`` line at the start, then at every tenth
of the work (at most every :data:`LINE_EVERY_S` seconds apart when steps are slow), with
the elapsed time and an ETA, tells whoever reads the log how far it got.
``--quiet`` (``show=False``) silences both.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Iterable, Iterator, Optional, Sequence, TypeVar

__all__ = ["progress", "LINE_EVERY_S"]

log = logging.getLogger("ptq_protein.progress")

T = TypeVar("T")
LINE_EVERY_S = 30.0  # a slow loop still logs at least this often (with an ETA)
_STEPS = 10  # lines per loop in logs: one per tenth of the work


def progress(items: Sequence[T], desc: str, unit: str, show: bool = True,
             terminal: Optional[bool] = None) -> Iterable[T]:
    """``items`` wrapped for progress: a tqdm bar on a terminal, log lines otherwise, nothing when ``show`` is off.

    ``terminal`` overrides the check of ``sys.stderr.isatty()`` (tests).
    """
    if not show or not items:
        return items
    if sys.stderr.isatty() if terminal is None else terminal:
        from tqdm.auto import tqdm

        return tqdm(items, desc=desc, unit=unit)
    return _lines(items, desc, unit)


def _lines(items: Sequence[T], desc: str, unit: str) -> Iterator[T]:
    total, start = len(items), time.perf_counter()
    log.info("%s: 0/%d %s", desc, total, unit)
    last_line, next_step = start, 1
    for done, item in enumerate(items, 1):
        yield item
        now = time.perf_counter()
        if done == total or done * _STEPS >= next_step * total or now - last_line >= LINE_EVERY_S:
            while done * _STEPS >= next_step * total:
                next_step += 1
            elapsed = now - start
            eta = elapsed / done * (total - done)
            log.info("%s: %d/%d %s (%d%%), %s elapsed%s", desc, done, total, unit, 100 * done // total,
                     _duration(elapsed), "" if done == total else f", about {_duration(eta)} left")
            last_line = now


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"
