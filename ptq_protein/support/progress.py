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

log = logging.getLogger("ptq_protein.support.progress")

T = TypeVar("T")
LINE_EVERY_S = 30.0  # a slow loop still logs at least this often (with an ETA)
_STEPS = 10  # lines per loop in logs: one per tenth of the work


def progress(items: Sequence[T], desc: str, unit: str, show: bool = True,
             terminal: Optional[bool] = None, weights: Optional[Sequence[int]] = None,
             weight_unit: str = "") -> Iterable[T]:
    """``items`` wrapped for progress: a tqdm bar on a terminal, log lines otherwise, nothing when ``show`` is off.

    ``weights`` (one per item, e.g. residues) make the bar count them and the lines
    report their rate (``weight_unit``/s), for loops whose items differ in cost.
    ``terminal`` overrides the check of ``sys.stderr.isatty()`` (tests).
    """
    if not show or not items:
        return items
    if weights is not None and len(weights) != len(items):
        raise ValueError(f"{len(weights)} weights for {len(items)} items")
    if sys.stderr.isatty() if terminal is None else terminal:
        from tqdm.auto import tqdm

        if weights is None:
            return tqdm(items, desc=desc, unit=unit)
        return _weighted_bar(tqdm(total=sum(weights), desc=desc, unit=weight_unit, unit_scale=True), items, weights)
    return _lines(items, desc, unit, weights, weight_unit)


def _weighted_bar(bar, items: Sequence[T], weights: Sequence[int]) -> Iterator[T]:
    with bar:
        for item, weight in zip(items, weights):
            yield item
            bar.update(weight)


def _lines(items: Sequence[T], desc: str, unit: str, weights: Optional[Sequence[int]] = None,
           weight_unit: str = "") -> Iterator[T]:
    total, start = len(items), time.perf_counter()
    done_weight, total_weight = 0, sum(weights) if weights is not None else 0
    log.info("%s: 0/%d %s", desc, total, unit)
    last_line, next_step = start, 1
    for done, item in enumerate(items, 1):
        yield item
        now = time.perf_counter()
        if weights is not None:
            done_weight += weights[done - 1]
        if done == total or done * _STEPS >= next_step * total or now - last_line >= LINE_EVERY_S:
            while done * _STEPS >= next_step * total:
                next_step += 1
            elapsed = now - start
            share = done_weight / total_weight if weights is not None and total_weight else done / total
            eta = elapsed / share * (1 - share) if share else 0.0
            rate = f", {done_weight / elapsed:.0f} {weight_unit}/s" if weights is not None and elapsed > 0 else ""
            log.info("%s: %d/%d %s (%d%%)%s, %s elapsed%s", desc, done, total, unit, 100 * done // total, rate,
                     _duration(elapsed), "" if done == total else f", about {_duration(eta)} left")
            last_line = now


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"
