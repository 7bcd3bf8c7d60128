"""One ``ptq-protein score`` job: checked in full before a model loads, then scored and written atomically.

:func:`plan_scores` reads and checks everything a user gives (sequence letters,
every mutant of the DMS file against the sequence, the output path, the score
column); :func:`run_scores` then needs only the model. Without a DMS file the
job scores every single mutant and draws the heatmap beside the CSV (skipped,
with a warning, when matplotlib is not installed: the CSV is the result).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple, Union

from torch import nn

from ptq_protein.data.fasta import ESM2_MAX_RESIDUES, validate_sequence
from ptq_protein.support.errors import InputError
from ptq_protein.support.io_utils import atomic_write_text, check_out_path
from ptq_protein.workloads.dms_csv import read_dms, scores_csv
from ptq_protein.workloads.mutants import (
    AMINO_ACIDS,
    DEFAULT_OFFSET,
    Mutant,
    offsets_also_matching,
    parse_mutants,
    single_mutants,
)
from ptq_protein.workloads.variant_heatmap import can_plot, plot_variant_heatmap
from ptq_protein.workloads.variant_scores import (
    DEFAULT_TOKS_PER_BATCH,
    Strategy,
    score_mutants,
    single_mutant_scores,
)

__all__ = ["ScoreJob", "ScoreReport", "plan_scores", "run_scores", "FIGURE_SUFFIXES"]

logger = logging.getLogger(__name__)

FIGURE_SUFFIXES = (".png", ".pdf", ".svg")  # eval.bench.plots.FORMATS, beside the CSV


@dataclass(frozen=True)
class ScoreJob:
    """What to score and where: ``mutants`` (parsed) and ``rows`` to write them in, checked by :func:`plan_scores`."""

    sequence: str
    strategy: Strategy
    out: Path
    column: str
    header: Tuple[str, ...]
    rows: Tuple[Tuple[str, ...], ...]
    mutants: Tuple[Mutant, ...]
    offset_idx: int = DEFAULT_OFFSET
    toks_per_batch: int = DEFAULT_TOKS_PER_BATCH
    figure: bool = False  # every single mutant: draw the heatmap too


@dataclass(frozen=True)
class ScoreReport:
    mutants: int
    seconds: float
    csv: Path
    figure: Optional[Path]


def plan_scores(sequence: str, strategy: Union[str, Strategy], out: Union[str, Path], column: str,
                dms: Optional[Union[str, Path]] = None, mutation_col: str = "mutant",
                offset_idx: int = DEFAULT_OFFSET, toks_per_batch: int = DEFAULT_TOKS_PER_BATCH,
                force: bool = False) -> ScoreJob:
    """A checked :class:`ScoreJob`; ``InputError`` / ``FileExistsError`` name the problem (nothing is written)."""
    strategy = Strategy.parse(strategy)
    sequence = validate_sequence(sequence, max_length=ESM2_MAX_RESIDUES, where="--sequence",
                                 limit_reason=f"score takes wild types of at most {ESM2_MAX_RESIDUES} residues, "
                                              "ESM-2's limit, whatever the model")
    if isinstance(toks_per_batch, bool) or not isinstance(toks_per_batch, int) or toks_per_batch < 1:
        raise InputError(f"--toks-per-batch {toks_per_batch!r} must be a positive number of tokens")
    if not column.strip():
        raise InputError("the score column name is empty; give one with --score-col")
    out = Path(out)
    if dms is not None:
        table = read_dms(dms, mutation_col)
        _check_paths(out, force, Path(dms))
        if column in table.header:
            raise InputError(f"{dms} already has a column {column!r}; name the score column with --score-col")
        mutants = parse_mutants(table.mutants, sequence, offset_idx, where=lambda i: f"{dms} line {i + 2}: ")
        also = offsets_also_matching(mutants, sequence, offset_idx)
        if also:  # the wild-type check passes under these too: a wrong offset would go unnoticed
            logger.warning("%s: every mutant's wild type also matches with --offset-idx %s (its mutants sit in runs "
                           "of one residue), so the wild-type check cannot confirm --offset-idx %d: make sure it is "
                           "the number of the sequence's first residue", dms, " or ".join(map(str, also)), offset_idx)
        return ScoreJob(sequence, strategy, out, column, table.header, table.rows, tuple(mutants), offset_idx,
                        toks_per_batch)
    figure = can_plot()
    if not figure:
        logger.warning("matplotlib is not installed: the heatmap is skipped, the CSV is written "
                       "(pip install 'ptq-protein[plot]' for the figure)")
    _check_paths(out, force, None, figures=figure)
    names = single_mutants(sequence, offset_idx)
    mutants = parse_mutants(names, sequence, offset_idx)
    return ScoreJob(sequence, strategy, out, column, ("mutant",), tuple((n,) for n in names), tuple(mutants),
                    offset_idx, toks_per_batch, figure)


def run_scores(model: nn.Module, job: ScoreJob, progress: bool = False, title: str = "") -> ScoreReport:
    """Score ``job`` with ``model``; write the CSV (and heatmap) atomically; the caller's model is not changed."""
    start = time.perf_counter()
    figure = None
    if job.figure:
        singles = single_mutant_scores(model, job.sequence, job.strategy, job.toks_per_batch, progress)
        scores = [float(singles.grid[m[0].index, AMINO_ACIDS.index(m[0].mt)]) for m in job.mutants]
    else:
        scores = score_mutants(model, job.sequence, job.mutants, job.strategy, job.toks_per_batch, progress)
    seconds = time.perf_counter() - start
    atomic_write_text(job.out, scores_csv(job.header, job.rows, job.column, scores))
    if job.figure:
        figure = plot_variant_heatmap(singles, job.sequence, job.out.with_suffix(".png"),
                                      title=title or job.column, offset_idx=job.offset_idx)
    return ScoreReport(len(scores), seconds, job.out, figure)


def _check_paths(out: Path, force: bool, dms: Optional[Path], figures: bool = False) -> None:
    """Refuse an output that would overwrite the input, an existing file without ``force``, or an unwritable path."""
    if dms is not None and out.resolve() == dms.resolve():
        raise InputError(f"--out {out} is the DMS input file; the input is never modified: give another --out")
    if out.is_dir():
        raise InputError(f"--out {out} is a folder; give a CSV file path such as scores.csv")
    paths = [out] + ([out.with_suffix(s) for s in FIGURE_SUFFIXES] if figures else [])
    for path in paths:
        check_out_path(path, force=force, replaceable=Path.is_file, what="file")
