"""The deep mutational scans of an ``eval variants`` run: which target each belongs to, checked before a model loads.

``--dms`` names a CSV file (the set must then hold one target: the file is its
assay) or a folder of ``<target id>.csv`` files (ProteinGym keeps one file per
assay); targets without a file get no comparison with experiment. Every file
needs the mutant column and ``DMS_score``; every mutant is parsed against its
target's sequence, so a wrong wild-type letter is refused before any model runs.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple, Union

from ptq_protein.data.sets import BenchmarkSet
from ptq_protein.support.errors import InputError
from ptq_protein.workloads.dms_csv import DMS_SCORE_COLUMN, read_dms
from ptq_protein.workloads.mutants import DEFAULT_OFFSET, Mutant, parse_mutants

__all__ = ["DmsAssay", "load_assays"]


@dataclass(frozen=True)
class DmsAssay:
    """One target's scan: its ``mutants`` (parsed) and ``measured`` DMS scores (NaN where a cell is empty).

    ``digest``: sha256 of the file and of the options that read it (a resumed run must read the same mutants).
    """

    path: str
    digest: str
    mutants: Tuple[Mutant, ...]
    measured: Tuple[float, ...]

    @property
    def measured_count(self) -> int:
        return sum(not math.isnan(v) for v in self.measured)


def load_assays(spec: Union[str, Path], bench: BenchmarkSet, mutation_col: str = "mutant",
                offset_idx: int = DEFAULT_OFFSET) -> Dict[str, DmsAssay]:
    """{target id: :class:`DmsAssay`} of ``spec`` (a CSV or a folder of ``<id>.csv``); ``InputError`` if unusable."""
    spec = Path(spec)
    if spec.is_dir():
        files = {t.id: spec / f"{t.id}.csv" for t in bench.targets if (spec / f"{t.id}.csv").is_file()}
        if not files:
            raise InputError(f"--dms {spec} holds no <target id>.csv for any of the {len(bench)} targets "
                             f"(e.g. {bench.ids[0]}.csv)")
    elif spec.is_file():
        if len(bench) != 1:
            raise InputError(f"--dms {spec} is one file but the set has {len(bench)} targets; select one with "
                             "--targets ID, or give a folder of <target id>.csv files")
        files = {bench.ids[0]: spec}
    else:
        raise InputError(f"--dms {spec} is neither a CSV file nor a folder")
    return {tid: _assay(path, bench.get(tid).sequence, mutation_col, offset_idx) for tid, path in files.items()}


def _assay(path: Path, sequence: str, mutation_col: str, offset_idx: int) -> DmsAssay:
    table = read_dms(path, mutation_col, require=(DMS_SCORE_COLUMN,))
    mutants = parse_mutants(table.mutants, sequence, offset_idx, where=lambda i: f"{path} line {i + 2}: ")
    measured = table.numbers(DMS_SCORE_COLUMN)
    if all(math.isnan(v) for v in measured):
        raise InputError(f"{path}: no row has a number in {DMS_SCORE_COLUMN}")
    digest = hashlib.sha256(path.read_bytes() + f"\0{mutation_col}\0{offset_idx}".encode()).hexdigest()
    return DmsAssay(str(path), digest, tuple(mutants), tuple(measured))
