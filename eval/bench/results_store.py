"""A resumable results table: one CSV row per (recipe, target), rewritten atomically.

Why rewrite instead of append: every finished row rewrites the whole file
through :func:`~ptq_protein.support.io_utils.atomic_write_text` (temp file + fsync +
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
A run that failed before scoring anything may be rerun with other settings
(its ``run.json`` is replaced, with a warning).

A row's output file (``pdb``, ``contacts`` or ``variants``: its path in the folder) is
recorded with its sha256 (``output_sha256``); the runner redoes a row whose file is
missing, damaged or replaced (another model's file copied in).

Validation on open: a row with missing or extra cells (a truncated line), an
unknown status, an empty key, a non-numeric or non-finite metric in an ``ok``
row, or an ``ok`` row without one of the task's ``required`` metrics is
dropped with a warning (it is rerun); repeated keys keep one copy when they are
identical and are all dropped (rerun) when they disagree. The repaired table is
written back, so nothing is ever counted twice.

Several processes, one table (API for multi-process runs)::

    store = ResultsStore(out / "results.csv", COLUMNS)   # any number of processes
    store.put(row)       # lock results.csv.lock, re-read the file, merge the row by key, rewrite atomically
    store.refresh()      # re-read rows other processes added

``put`` holds ``results.csv.lock`` (:func:`ptq_protein.support.io_utils.file_lock`,
blocking, released by the kernel if the process dies) only for the
read-merge-write, so every row of every writer survives. One *run* per folder
is enforced separately by :func:`ptq_protein.support.io_utils.folder_lock`, which the
eval tasks hold for their whole run (a coordinator of several ranks takes it
once and lets its ranks ``put`` rows).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ptq_protein.support.file_reads import read_csv, read_json
from ptq_protein.support.io_utils import atomic_write_text, file_lock

__all__ = ["KEY_COLUMNS", "STATUS_OK", "OUTPUT_COLUMNS", "OUTPUT_DIGEST", "ResultsStore", "check_run_info", "is_done"]

logger = logging.getLogger(__name__)

KEY_COLUMNS = ("target", "recipe")
STATUS_OK = "ok"
_DONE_PREFIXES = (STATUS_OK, "skipped")
_STATUS_PREFIXES = (STATUS_OK, "skipped", "error")
OUTPUT_COLUMNS = ("pdb", "contacts", "variants")  # a row's output file (its path inside the folder)
OUTPUT_DIGEST = "output_sha256"  # that file's sha256 when written: a replaced or damaged output is redone
TEXT_COLUMNS = OUTPUT_COLUMNS + (OUTPUT_DIGEST,)  # non-numeric cells besides the key and status
RUN_INFO_NAME = "run.json"
INPUTS_KEY = "inputs"  # run.json field: {"<argument> <path>": sha256} of every input file (see input_digests)

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
    text_columns : columns whose cells are text (everything else must parse as a number on resume).
    required : columns every ``ok`` row holds as a finite number (the headline metric). :meth:`put`
        turns an ``ok`` row without one into an ``error`` row, so it is rerun and never averaged.
    """

    def __init__(self, path: Union[str, Path], columns: Sequence[str], text_columns: Sequence[str] = TEXT_COLUMNS,
                 required: Sequence[str] = ()):
        columns = tuple(columns)
        if columns[:2] != KEY_COLUMNS or "status" not in columns or len(set(columns)) != len(columns):
            raise ValueError(f"results columns {columns} must start with {KEY_COLUMNS}, include 'status' "
                             "and have no repeats")
        self.path = Path(path)
        self.columns = columns
        self.text_columns = tuple(text_columns)
        self.required = tuple(required)
        if set(self.required) - set(columns):
            raise ValueError(f"required columns {sorted(set(self.required) - set(columns))} are not in {columns}")
        self._rows: Dict[Key, Dict[str, str]] = {}
        if self.path.exists():
            with self._lock():
                self._rows, problems = self._read()
                if problems:
                    for problem in problems:
                        logger.warning("%s: %s", self.path, problem)
                    self._save()  # the repaired table, so the file never holds a dropped row again
            logger.info("resuming: %d rows already in %s (%d done)", len(self._rows), self.path,
                        sum(is_done(r) for r in self._rows.values()))

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
        key = (str(row["recipe"]), str(row["target"]))
        cells = {c: _format(row.get(c)) for c in self.columns}
        problem = self._row_problem(cells)
        if problem and cells["status"] == STATUS_OK:
            logger.warning("%s / %s: %s; recorded as an error, so it is rerun", key[0], key[1], problem)
            cells["status"] = f"error: {problem}"
        with self._lock():  # read-merge-write: rows other processes added meanwhile survive
            self.refresh(locked=True)
            self._rows[key] = cells
            self._save()

    def refresh(self, locked: bool = False) -> None:
        """Re-read the table from disk (rows other processes wrote); malformed rows are skipped with a warning."""
        if not self.path.exists():
            return
        if locked:
            rows, problems = self._read()
        else:
            with self._lock():
                rows, problems = self._read()
        for problem in problems:
            logger.warning("%s: %s", self.path, problem)
        self._rows = rows

    # -- file ------------------------------------------------------------------
    def _lock(self):
        return file_lock(self.path.with_name(self.path.name + ".lock"), wait=True, purpose=str(self.path))

    def _read(self) -> Tuple[Dict[Key, Dict[str, str]], List[str]]:
        """Valid rows by key, and a description of each row dropped."""
        text = self.path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            return {}, ["the table is empty (a truncated file?); starting it again"]
        header, table = read_csv(text, str(self.path), "fix that row, or give a new --out folder")
        header = tuple(header)
        if header == tuple(c for c in self.columns if c != OUTPUT_DIGEST) != self.columns:  # an older release's
            table = [{**row, OUTPUT_DIGEST: ""} for row in table]  # rows without digests: files checked by presence
        elif header != self.columns:
            raise ValueError(f"{self.path} has columns {list(header)}, not the {list(self.columns)} this command "
                             "writes; give a new --out folder (or delete the old table)")
        rows: Dict[Key, Dict[str, str]] = {}
        conflicts, problems = set(), []
        for line, row in enumerate(table, start=2):
            problem = self._row_problem(row)
            if problem:
                problems.append(f"line {line} dropped ({problem}); it will be rerun")
                continue
            key = (row["recipe"], row["target"])
            if key in rows and rows[key] != row:
                conflicts.add(key)
            elif key in rows:
                problems.append(f"line {line} repeats the row of {key[1]} / {key[0]}; the copy is dropped")
            rows[key] = dict(row)
        for key in conflicts:
            del rows[key]
            problems.append(f"conflicting rows for {key[1]} / {key[0]} dropped; it will be rerun")
        return rows, problems

    def _row_problem(self, row: Mapping[str, Any]) -> Optional[str]:
        if None in row or any(v is None for v in row.values()):
            return "wrong number of cells: a truncated or garbled line"
        if not row["target"] or not row["recipe"]:
            return "empty target or recipe"
        if not str(row["status"]).startswith(_STATUS_PREFIXES):
            return f"unknown status {row['status'][:40]!r}"
        if row["status"] == STATUS_OK:
            for column in self.columns:
                if column in (*KEY_COLUMNS, "status", *self.text_columns):
                    continue
                if row[column] == "":
                    if column in self.required:
                        return f"{column} is missing (an ok row needs it)"
                    continue
                try:
                    value = float(row[column])
                except ValueError:
                    return f"{column} {row[column][:40]!r} is not a number"
                if not math.isfinite(value):
                    return f"{column} is {row[column]!r}, not a finite number"
        return None

    def _save(self) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self._rows.values())
        atomic_write_text(self.path, buffer.getvalue())


def check_run_info(out_dir: Union[str, Path], info: Mapping[str, Any], scored: bool = True) -> None:
    """Write ``out_dir/run.json``, or check that an existing one records the same run.

    ``scored=False`` (no done row in the table yet) lets a run that failed before
    scoring anything be rerun with corrected settings: the old ``run.json`` is replaced.

    Raises
    ------
    ValueError
        When ``out_dir`` holds results of a run with different settings.
    """
    path = Path(out_dir) / RUN_INFO_NAME
    wanted = json.loads(json.dumps(dict(info), sort_keys=True, default=str))
    if path.exists():
        old = read_json(path, "delete it or use a new --out folder")
        if not isinstance(old, dict):
            raise ValueError(f"{path} is not a run record (a JSON object); delete it or use a new --out folder")
        changed = sorted(k for k in set(old) | set(wanted) if old.get(k) != wanted.get(k))
        if changed and not scored:
            logger.warning("%s: the earlier run scored nothing; replacing its settings (%s)", path, ", ".join(changed))
        elif changed:
            diffs = "; ".join(_difference(k, old.get(k), wanted.get(k)) for k in changed)
            raise ValueError(f"{path.parent} holds results of a different run ({diffs}); resume with the same "
                             "settings or give a new --out folder")
        if not changed:
            return
    atomic_write_text(path, json.dumps(wanted, indent=2, sort_keys=True) + "\n")


def _difference(key: str, old: Any, new: Any) -> str:
    """One changed ``run.json`` field in words; for ``inputs`` (file digests) the files whose content changed."""
    if key == INPUTS_KEY and old is None:
        return f"the earlier run recorded no digest of its input files ({', '.join(sorted(new or {}))}), so they "\
               "cannot be checked (an older release)"
    if key != INPUTS_KEY or not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return f"{key}: {old!r} -> {new!r}"
    files = sorted(name for name in set(old) | set(new) if old.get(name) != new.get(name))
    return "; ".join(f"input file {name} " + ("changed content since the earlier run" if name in old and name in new
                                              else "is new" if name in new else "is no longer read")
                     for name in files)


def _format(value: Any) -> str:
    """CSV cell text: floats with 6 significant decimals, NaN and None as empty cells."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)
