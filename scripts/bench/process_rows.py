"""Rows that are whole processes: one command each, run untimed once (the warm-up, which is also the cold run:
compilation caches start empty), then ``reps`` interleaved rounds whose order rotates; the median is kept.

A row that cannot run here carries the reason (``absent``) and is listed, not dropped; a row whose process fails
keeps the failure's one line (exit code and last output line) and is not run again.
"""

from __future__ import annotations

import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from bench.common import Measured, run_measured

OUT = "{out}"  # in a row's command: the run's own scratch folder (made empty before the run)


@dataclass(frozen=True)
class Row:
    """One timed command. ``kind``: "anchor" (what users run instead) or "as typed" (this toolkit's CLI)."""

    key: str
    label: str
    kind: str
    cmd: Tuple[str, ...] = ()
    absent: str = ""  # why the row does not run here ('' when it runs)
    compiles: bool = False  # its first run pays compilation (its cold wall is reported)
    extra: Tuple[Tuple[str, str], ...] = ()  # environment added for this row only


@dataclass
class RowResult:
    """A row's runs: the warm-up (``first``) and the timed ones, the output of the last timed run, a failure."""

    row: Row
    first: Optional[Measured] = None
    runs: List[Measured] = field(default_factory=list)
    out: Optional[Path] = None
    failure: str = ""

    @property
    def ok(self) -> bool:
        return not self.row.absent and not self.failure and bool(self.runs)

    def median(self, name: str) -> float:
        """The median of one :class:`Measured` field (or property) over the timed runs."""
        return statistics.median(float(getattr(run, name)) for run in self.runs)

    @property
    def peak_rss_gib(self) -> float:
        return max(run.rss_gib for run in self.runs)

    def status(self) -> str:
        """'' for a row that ran, else why not (absent here, or its failure)."""
        return self.row.absent or self.failure or ("" if self.runs else "not run")


def run_rows(rows: Sequence[Row], reps: int, scratch: Path, env: Mapping[str, str],
             warmup: bool = True) -> Dict[str, RowResult]:
    """Every row: ``warmup`` round first (untimed), then ``reps`` timed rounds, each in a rotated order."""
    results = {row.key: RowResult(row) for row in rows}
    active = [row for row in rows if not row.absent]
    rounds = (["warm-up"] if warmup else []) + [f"rep{i + 1}" for i in range(reps)]
    for n, name in enumerate(rounds):
        shift = n % max(1, len(active))
        for row in active[shift:] + active[:shift]:
            result = results[row.key]
            if result.failure:
                continue
            out = scratch / f"{row.key}-{name}"
            out.mkdir(parents=True)
            cmd = [part.replace(OUT, str(out)) for part in row.cmd]
            measured = run_measured(cmd, {**env, **dict(row.extra)}, log=scratch / f"{row.key}-{name}.log")
            if measured.returncode != 0:
                result.failure = measured.failure()
                continue
            if name == "warm-up":
                result.first = measured
                _remove(out)
                continue
            if result.first is None:  # no warm-up round: the first timed run is the cold one
                result.first = measured
            result.runs.append(measured)
            _remove(result.out)
            result.out = out
    return results


def _remove(path: Optional[Path]) -> None:
    if path is not None and path.is_dir():
        shutil.rmtree(path)
