"""Progress of long loops: a bar for a person at a terminal, a line per step with an ETA in logs.

Why two forms: a tqdm bar is the right feedback in a terminal, but in the log of
a batch job (stderr redirected to a file) it is either nothing or a wall of
carriage returns. There, one ``logging`` line at the start, then at every tenth
of the work (at most every :data:`LINE_EVERY_S` seconds apart when steps are slow), with
the elapsed time and an ETA, tells whoever reads the log how far it got.
``--quiet`` (``show=False``) silences both.

Inside one long step (a fold of minutes) there is no loop to wrap: :class:`Ticker` takes the step's own
counts (e.g. trunk blocks run) and logs a line only once :data:`LINE_EVERY_S` seconds have passed since
the last, so a step that ends sooner says nothing.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Callable, Iterable, Iterator, Optional, Sequence, TypeVar

__all__ = ["progress", "Ticker", "LINE_EVERY_S"]

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
            rate = f", {done_weight / elapsed:.0f} {weight_unit}/s" if weights is not None and elapsed > 0 else ""
            log.info("%s: %d/%d %s (%d%%)%s, %s", desc, done, total, unit, 100 * done // total, rate,
                     _timing(elapsed, share))
            last_line = now


class Ticker:
    """Log lines for one long step: ``ticker(done, note)`` logs ``desc: done/total unit (note), ... left``,
    at most once per ``interval`` seconds and never before ``interval`` has passed since the step began.

    ``clock`` (seconds, monotonic) is injectable for tests.
    """

    def __init__(self, desc: str, total: int, unit: str, interval: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if total <= 0:
            raise ValueError(f"Ticker total={total}: a step of at least one unit")
        self.desc, self.total, self.unit, self.interval, self._clock = desc, total, unit, interval, clock
        self._start = self._last = clock()

    def __call__(self, done: int, note: str = "") -> None:
        now = self._clock()
        if now - self._last < self.interval:
            return
        self._last = now
        log.info("%s: %d/%d %s%s, %s", self.desc, done, self.total, self.unit, f" ({note})" if note else "",
                 _timing(now - self._start, done / self.total))


def _timing(elapsed: float, share: float) -> str:
    """``"X elapsed, about Y left"`` for ``share`` (0-1) of the work done in ``elapsed`` seconds."""
    if share >= 1 or share <= 0:
        return f"{_duration(elapsed)} elapsed"
    return f"{_duration(elapsed)} elapsed, about {_duration(elapsed / share * (1 - share))} left"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"
