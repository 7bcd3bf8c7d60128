"""A resumable results table: one CSV row per (recipe, target), rewritten atomically.

Why rewrite instead of append: every finished row rewrites the whole file
through :func:`~ptq_protein.io_utils.atomic_write_text` (temp file + fsync +
rename), so an interrupted run (Ctrl-C, a killed job, a full disk) leaves either
the old table or the new one, never a half-written line, and a resumed run can
trust every row it reads. Tables hold at most a few thousand rows (139 targets
x a handful of recipes), so the rewrite costs milliseconds.

Rows are keyed by ``(recipe, target)``, never by position: adding a row with a
key already present replaces it (a retried error), so a table never holds
duplicates. A row whose ``status`` is ``ok`` or starts with ``skipped`` is
*done* and is not redone by a resumed run; ``error: ...`` rows are retried.

A ``run.json`` beside the table records what produced it (model, sets,
calibration, options); resuming with different settings is refused, because
mixing rows from two protocols in one table would silently corrupt the summary.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ptq_protein.io_utils import atomic_write_text

__all__ = ["KEY_COLUMNS", "STATUS_OK", "ResultsStore", "check_run_info", "is_done"]

logger = logging.getLogger(__name__)

KEY_COLUMNS = ("target", "recipe")
STATUS_OK = "ok"
_DONE_PREFIXES = (STATUS_OK, "skipped")
RUN_INFO_NAME = "run.json"

Key = Tuple[str, str]  # (recipe, target)


def is_done(row: Mapping[str, Any]) -> bool:
    """True for rows a resumed run keeps (``ok`` or ``skipped: ...``); ``error: ...`` rows are retried."""
    return str(row.get("status", "")).startswith(_DONE_PREFIXES)


class ResultsStore:
    """The rows of one ``results.csv``, loaded on open and saved after every :meth:`put`.

    Parameters
    ----------
    path : path of the CSV (created on the first :meth:`put`).
    columns : the column order; must start with ``target, recipe`` and contain ``status``.
        An existing file with a different header is refused (use another folder).
    """

    def __init__(self, path: Union[str, Path], columns: Sequence[str]):
        columns = tuple(columns)
        if columns[:2] != KEY_COLUMNS or "status" not in columns or len(set(columns)) != len(columns):
            raise ValueError(f"results columns {columns} must start with {KEY_COLUMNS}, include 'status' "
                             "and have no repeats")
        self.path = Path(path)
        self.columns = columns
        self._rows: Dict[Key, Dict[str, str]] = {}
        if self.path.exists():
            self._load()

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Dict[str, str]]:
        return iter(list(self._rows.values()))

    def get(self, recipe: str, target: str) -> Optional[Dict[str, str]]:
        """The row of ``(recipe, target)`` as strings, or None."""
        row = self._rows.get((recipe, target))
        return dict(row) if row is not None else None

    def is_done(self, recipe: str, target: str) -> bool:
        row = self._rows.get((recipe, target))
        return row is not None and is_done(row)

    def rows(self) -> List[Dict[str, str]]:
        """All rows (strings, as in the file), in insertion order."""
        return [dict(r) for r in self._rows.values()]

    def put(self, row: Mapping[str, Any]) -> None:
        """Add or replace the row of ``(row['recipe'], row['target'])`` and save the table atomically."""
        unknown = set(row) - set(self.columns)
        if unknown:
            raise ValueError(f"result row has columns {sorted(unknown)} that the table {self.path} does not have")
        missing = [c for c in (*KEY_COLUMNS, "status") if not row.get(c)]
        if missing:
            raise ValueError(f"result row {dict(row)} lacks {missing}")
        self._rows[(str(row["recipe"]), str(row["target"]))] = {c: _format(row.get(c)) for c in self.columns}
        self._save()

    # -- file ------------------------------------------------------------------
    def _load(self) -> None:
        with self.path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = tuple(reader.fieldnames or ())
            if header != self.columns:
                raise ValueError(f"{self.path} has columns {list(header)}, not the {list(self.columns)} this command "
                                 "writes; give a new --out folder (or delete the old table)")
            for row in reader:
                self._rows[(row["recipe"], row["target"])] = dict(row)  # last wins: no duplicates
        logger.info("resuming: %d rows already in %s (%d done)", len(self._rows), self.path,
                    sum(is_done(r) for r in self._rows.values()))

    def _save(self) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self._rows.values())
        atomic_write_text(self.path, buffer.getvalue())


def check_run_info(out_dir: Union[str, Path], info: Mapping[str, Any]) -> None:
    """Write ``out_dir/run.json``, or check that an existing one records the same run.

    Raises
    ------
    ValueError
        When ``out_dir`` holds results of a run with different settings.
    """
    path = Path(out_dir) / RUN_INFO_NAME
    wanted = json.loads(json.dumps(dict(info), sort_keys=True, default=str))
    if path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); delete it or use a new --out folder") from e
        changed = sorted(k for k in set(old) | set(wanted) if old.get(k) != wanted.get(k))
        if changed:
            diffs = "; ".join(f"{k}: {old.get(k)!r} -> {wanted.get(k)!r}" for k in changed)
            raise ValueError(f"{path.parent} holds results of a different run ({diffs}); resume with the same "
                             "settings or give a new --out folder")
        return
    atomic_write_text(path, json.dumps(wanted, indent=2, sort_keys=True) + "\n")


def _format(value: Any) -> str:
    """CSV cell text: floats with 6 significant decimals, NaN and None as empty cells."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)
