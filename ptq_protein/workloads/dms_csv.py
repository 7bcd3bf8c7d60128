"""Deep-mutational-scan CSV files: read the mutant column, write the rows back with a score column added.

predict.py reads the file with pandas and adds one column named after the model;
here the rows travel as text (``csv``), so every other cell comes out exactly as
it went in, and the input file is never opened for writing.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence, Tuple, Union

from ptq_protein.support.errors import InputError
from ptq_protein.support.file_reads import regular_file

__all__ = ["DmsTable", "read_dms", "scores_csv", "DMS_SCORE_COLUMN"]

DMS_SCORE_COLUMN = "DMS_score"  # ProteinGym's experimental fitness column


@dataclass(frozen=True)
class DmsTable:
    """A DMS CSV as text: ``header``, ``rows`` (each as long as the header), ``mutation_col`` in the header."""

    path: str
    header: Tuple[str, ...]
    rows: Tuple[Tuple[str, ...], ...]
    mutation_col: str

    @property
    def mutants(self) -> List[str]:
        return self.column(self.mutation_col)

    def column(self, name: str) -> List[str]:
        index = self.header.index(name)
        return [row[index] for row in self.rows]

    def numbers(self, name: str) -> List[float]:
        """The cells of column ``name`` as floats; an empty or non-numeric cell is NaN (no measurement)."""
        out = []
        for cell in self.column(name):
            try:
                out.append(float(cell))
            except ValueError:
                out.append(math.nan)
        return out


def read_dms(path: Union[str, Path], mutation_col: str = "mutant", require: Sequence[str] = ()) -> DmsTable:
    """The rows of ``path``; ``InputError`` for an unreadable file, a missing column, ragged rows or empty mutants.

    ``require``: further columns that must exist (e.g. :data:`DMS_SCORE_COLUMN`).
    """
    try:
        text = regular_file(path, "DMS file").read_text(encoding="utf-8-sig")  # not /dev/zero: read forever
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read the DMS file {path}: {err}") from err
    try:
        lines = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as err:
        raise InputError(f"{path} is not a readable CSV file ({err})") from err
    if not lines or not any(lines[0]):
        raise InputError(f"{path} is empty; a DMS CSV needs a header line with a {mutation_col!r} column")
    header = tuple(lines[0])
    for name in (mutation_col, *require):
        if name not in header:
            fix = "name the mutant column with --mutation-col" if name == mutation_col else \
                f"the file needs the column {name!r} (ProteinGym's name for it): rename the column that holds it"
            raise InputError(f"{path} has no column {name!r} (its columns: {', '.join(header)}); {fix}")
    rows = tuple(tuple(row) for row in lines[1:] if row)  # blank lines carry no row
    column = header.index(mutation_col)
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise InputError(f"{path} line {i + 2}: {len(row)} cells, the header has {len(header)}")
        if not row[column].strip():
            raise InputError(f"{path} line {i + 2}: the {mutation_col!r} cell is empty")
    if not rows:
        raise InputError(f"{path} holds no rows under its header")
    return DmsTable(str(path), header, rows, mutation_col)


def scores_csv(header: Sequence[str], rows: Sequence[Sequence[str]], column: str, scores: Sequence[float]) -> str:
    """CSV text of ``rows`` with a last column ``column`` holding ``scores`` (6 decimals)."""
    if len(rows) != len(scores):
        raise ValueError(f"{len(scores)} scores for {len(rows)} rows")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*header, column])
    for row, score in zip(rows, scores):
        writer.writerow([*row, f"{score:.6f}"])
    return buffer.getvalue()
