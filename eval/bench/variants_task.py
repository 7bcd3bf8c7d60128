"""``eval variants``: zero-shot variant effect scores, FP vs each quantized recipe, and vs experiment.

Per target and recipe the model scores every single mutant
(:func:`~ptq_protein.workloads.variant_scores.single_mutant_scores`, 19 per
residue) with one of fair-esm predict.py's strategies; the row holds

* ``spearman_vs_fp``: Spearman's rho between this recipe's and the FP model's scores
  over those mutants: the quantization drift alone, measurable without any
  experimental data (1 for FP itself, computed the same way);
* ``spearman_vs_dms``, ``n_dms``: with a DMS assay for the target (``--dms``), rho
  between the recipe's scores of the assay's mutants and ``DMS_score`` (ProteinGym's
  headline), over the ``n_dms`` measured rows.

Scores are saved as ``OUT/variants/<recipe>/<target>.npy`` (float32 [L, 20], columns
ACDEFGHIKLMNPQRSTVWY, wild-type cells hold the wild type's own score); the FP ones
are read back for ``spearman_vs_fp``, so a resumed run needs no FP recompute.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
from torch import nn

from ptq_protein.data.sets import BenchmarkSet, Target
from ptq_protein.eval.bench.distributed import SINGLE, Ranks
from ptq_protein.eval.bench.dms_assays import DmsAssay
from ptq_protein.eval.bench.runner import (
    FP_RECIPE,
    RunOptions,
    normalize_recipes,
    open_run,
    prediction_path,
    run_identity,
    run_recipes,
)
from ptq_protein.eval.bench.summary import MetricSpec, write_outputs
from ptq_protein.eval.rank_correlation import spearman
from ptq_protein.support.io_utils import atomic_write_bytes
from ptq_protein.workloads.mutants import AMINO_ACIDS
from ptq_protein.workloads.variant_scores import (
    DEFAULT_TOKS_PER_BATCH,
    SingleMutantScores,
    Strategy,
    score_mutants,
    single_mutant_scores,
)

__all__ = ["VARIANT_COLUMNS", "VariantOptions", "evaluate_variants", "variant_metrics"]

logger = logging.getLogger(__name__)

VARIANT_COLUMNS = ("target", "recipe", "status", "length", "spearman_vs_dms", "n_dms", "spearman_vs_fp", "seconds",
                   "variants", "output_sha256")
_VS_DMS = MetricSpec("spearman_vs_dms", "Spearman vs DMS_score", limits=(-1.0, 1.0))
_VS_FP = MetricSpec("spearman_vs_fp", "Spearman vs FP scores", compare_to_fp=False, limits=None)


@dataclass(frozen=True)
class VariantOptions:
    """How each model scores: predict.py's strategy and the token budget of the masked copies."""

    strategy: Strategy = Strategy.MASKED_MARGINALS
    toks_per_batch: int = DEFAULT_TOKS_PER_BATCH

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", Strategy.parse(self.strategy))
        if isinstance(self.toks_per_batch, bool) or not isinstance(self.toks_per_batch, int) or self.toks_per_batch < 1:
            raise ValueError(f"toks_per_batch={self.toks_per_batch!r} must be a positive integer")


def variant_metrics(with_dms: bool) -> tuple:
    """The summary's metrics, headline first: vs experiment when there is one, else the drift from FP."""
    return (_VS_DMS, _VS_FP) if with_dms else (_VS_FP,)


def evaluate_variants(model: nn.Module, bench: BenchmarkSet, recipes: Sequence[str], out_dir: Union[str, Path],
                      options: RunOptions = RunOptions(), scoring: VariantOptions = VariantOptions(),
                      assays: Optional[Mapping[str, DmsAssay]] = None, run_info: Optional[Mapping[str, Any]] = None,
                      note: str = "", ranks: Ranks = SINGLE) -> Dict[str, Any]:
    """Score every target's single mutants under each recipe; write results, summary and plot.

    Parameters
    ----------
    model : fair-esm `ESM2` or transformers `EsmForMaskedLM` (float; never modified).
    bench, recipes, out_dir, options, run_info, note, ranks : as in
        `ptq_protein.eval.bench.structure_task.evaluate_structure`.
    scoring : the strategy and token budget (`VariantOptions`).
    assays : {target id: `ptq_protein.eval.bench.dms_assays.DmsAssay`} (see `load_assays`).

    Returns
    -------
    dict
        `results`, `summary`, `plot` paths and `counts`.
    """
    out_dir, assays = Path(out_dir), dict(assays or {})
    info = {"command": "eval variants", **(run_info or {}), **run_identity(model, options),
            "strategy": scoring.strategy.value, "dms": {t: a.digest for t, a in sorted(assays.items())}}

    def evaluate(recipe: str, qmodel: nn.Module, target: Target) -> Dict[str, Any]:
        return _score_target(qmodel, target, recipe, out_dir, scoring, assays.get(target.id))

    with open_run(out_dir, info, VARIANT_COLUMNS, ranks) as store:
        counts = run_recipes(model, bench, recipes, store, evaluate, options, ranks)
        if not ranks.is_main:
            return {"results": store.path, "counts": counts}
        details = [f"Scores: {scoring.strategy.value} (fair-esm predict.py) of every single mutant, 19 per residue. "
                   "Spearman vs FP ranks a recipe's scores against the FP model's on the same mutants "
                   "(the quantization drift); vs DMS_score: the --dms assay's measured rows (n_dms)."]
        paths = write_outputs(out_dir, store.rows(), normalize_recipes(recipes), bench.ids,
                              variant_metrics(bool(assays)), title=f"eval variants: {bench.name}", note=note,
                              details=details)
        return {**paths, "results": store.path, "counts": counts}


def _score_target(model: nn.Module, target: Target, recipe: str, out_dir: Path, scoring: VariantOptions,
                  assay: Optional[DmsAssay]) -> Dict[str, Any]:
    singles = single_mutant_scores(model, target.sequence, scoring.strategy, scoring.toks_per_batch)
    grid = singles.grid.numpy().astype(np.float32)  # as saved, so FP compared with itself is exactly 1
    path = prediction_path(out_dir, "variants", recipe, target.id, ".npy")
    atomic_write_bytes(path, _npy_bytes(grid))
    changed = np.array([[aa != wt for aa in AMINO_ACIDS] for wt in target.sequence])
    fp = _fp_grid(out_dir, target, grid.shape)
    row: Dict[str, Any] = {"variants": path.relative_to(out_dir).as_posix(),
                           "spearman_vs_fp": spearman(grid[changed], fp[changed])}
    if assay is not None:
        predicted = _assay_scores(model, target, singles, assay, scoring)
        row.update(spearman_vs_dms=spearman(predicted, assay.measured), n_dms=assay.measured_count)
    return row


def _assay_scores(model: nn.Module, target: Target, singles: SingleMutantScores, assay: DmsAssay,
                  scoring: VariantOptions) -> List[float]:
    """Scores of the assay's mutants: read from the single-mutant grid where it holds them, else scored here.

    Marginal strategies add their substitutions' cells (as ``score_mutants`` does); pseudo-ppl scores a
    multi-mutant sequence afresh.
    """
    def from_grid(mutant) -> Optional[float]:
        if any(s.mt not in AMINO_ACIDS for s in mutant) or (len(mutant) > 1 and not scoring.strategy.marginal):
            return None
        return float(sum(singles.grid[s.index, AMINO_ACIDS.index(s.mt)] for s in mutant))

    scores = [from_grid(m) for m in assay.mutants]
    rest = [i for i, s in enumerate(scores) if s is None]
    if rest:
        fresh = score_mutants(model, target.sequence, [assay.mutants[i] for i in rest], scoring.strategy,
                              scoring.toks_per_batch)
        for i, value in zip(rest, fresh):
            scores[i] = value
    return scores


def _fp_grid(out_dir: Path, target: Target, shape: tuple) -> np.ndarray:
    path = prediction_path(out_dir, "variants", FP_RECIPE, target.id, ".npy")
    if not path.exists():
        raise ValueError(f"FP scores {path} are missing, so {target.id} cannot be compared with FP; rerun (fp runs "
                         "first)")
    fp = np.load(path, allow_pickle=False)
    if fp.shape != shape:
        raise ValueError(f"FP scores {path} have shape {fp.shape}, this recipe's {shape}")
    return fp


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()
