"""``eval structure``: fold a benchmark set with FP and quantized ESMFold, score every prediction.

Per target and recipe the row holds the scores against the native (TM-score,
GDT-TS, GDT-HA, RMSD, lDDT, from :mod:`ptq_protein.eval`), the mean pLDDT, and
the scores against the FP prediction of the same target (``tm_fidelity``,
``rmsd_vs_fp``): the quantization error alone, free of the model's own error.
Predicted PDBs go to ``OUT/pdb/<recipe>/<target>.pdb``; the FP ones are also the
reference that ``tm_fidelity`` is computed against (read back from disk, so a
resumed run needs no FP refold).

Residue pairing with the native follows ``Target.numbering``: ``sequence``
(native residue i is sequence position i) pairs by number, ``author`` pairs by
sequence alignment. Targets without a native are scored against FP only.
Scores against the native are normalised as ``RunOptions.tm_normalize`` says
(recorded in ``run.json`` and printed in ``summary.md``).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from torch import nn

from ptq_protein.data.sets import BenchmarkSet, Numbering, Target
from ptq_protein.eval.bench.distributed import SINGLE, Ranks
from ptq_protein.eval.bench.results_store import ResultsStore
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
from ptq_protein.eval.tmscore import TMNormalize
from ptq_protein.support.io_utils import atomic_write_text

__all__ = ["STRUCTURE_COLUMNS", "STRUCTURE_METRICS", "evaluate_structure", "score_prediction"]

logger = logging.getLogger(__name__)

STRUCTURE_COLUMNS = ("target", "recipe", "status", "length", "tm_score", "gdt_ts", "gdt_ha", "rmsd", "lddt",
                     "plddt", "n_aligned", "native_length", "tm_fidelity", "rmsd_vs_fp", "seconds", "pdb",
                     "output_sha256")
# The headline metric comes first (summary table with bootstrap interval, and the plot).
STRUCTURE_METRICS = (
    MetricSpec("tm_score", "TM-score vs native"),
    MetricSpec("gdt_ts", "GDT-TS vs native"),
    MetricSpec("lddt", "lDDT vs native"),
    MetricSpec("rmsd", "RMSD vs native (Å)", higher_is_better=False, limits=None),
    MetricSpec("plddt", "mean pLDDT", limits=(0.0, 100.0)),
    MetricSpec("tm_fidelity", "TM-score vs FP prediction", compare_to_fp=False),
)


def evaluate_structure(model: nn.Module, bench: BenchmarkSet, recipes: Sequence[str], out_dir: Union[str, Path],
                       options: RunOptions = RunOptions(), run_info: Optional[Mapping[str, Any]] = None,
                       note: str = "", ranks: Ranks = SINGLE) -> Dict[str, Any]:
    """Fold and score every target of ``bench`` under each recipe; write results, summary and plot.

    Parameters
    ----------
    model : ``EsmForProteinFolding`` (float; never modified).
    bench : evaluation targets (natives optional).
    recipes : preset names; ``fp`` is always run first (the reference).
    out_dir : output folder; an earlier run there is resumed (same ``run_info`` required).
    options : calibration set, length cap, recycles, progress.
    run_info : what identifies the run (model, set, calibration, ...), checked on resume.
    note : a line for the summary (e.g. "tiny random model: toolkit check, not biology").
    ranks : the processes sharing the run (:mod:`~ptq_protein.eval.bench.distributed`); rank 0 writes the summary.

    Returns
    -------
    dict with ``results``, ``summary``, ``plot`` paths and ``counts`` (ok/skipped/error/resumed).
    """
    from ptq_protein.eval.bench.folding import require_esmfold

    require_esmfold(model)
    out_dir = Path(out_dir)
    run_info = {"command": "eval structure", **(run_info or {}), "tm_normalize": options.tm_normalize.value,
                **run_identity(model, options)}
    with open_run(out_dir, run_info, STRUCTURE_COLUMNS, ranks, required=("tm_fidelity",)) as store:
        return _run(model, bench, recipes, out_dir, store, options, note, ranks)


def _run(model: nn.Module, bench: BenchmarkSet, recipes: Sequence[str], out_dir: Path, store: ResultsStore,
         options: RunOptions, note: str, ranks: Ranks) -> Dict[str, Any]:
    def evaluate(recipe: str, qmodel: nn.Module, target: Target) -> Dict[str, Any]:
        return _fold_and_score(qmodel, bench, target, recipe, out_dir, options)

    counts = run_recipes(model, bench, recipes, store, evaluate, options, ranks)
    if not ranks.is_main:  # rank 0 writes the summary, from every rank's rows
        return {"results": store.path, "counts": counts}
    paths = write_outputs(out_dir, store.rows(), normalize_recipes(recipes), bench.ids, STRUCTURE_METRICS,
                          title=f"eval structure: {bench.name}", note=note,
                          details=[_NORMALIZE_LINE[options.tm_normalize]])
    return {**paths, "results": store.path, "counts": counts}


_NORMALIZE_LINE = {
    TMNormalize.NATIVE: "TM-score and GDT vs native are normalised by the native's observed residues "
                        "(`--tm-normalize native`, as `TMscore pred native`).",
    TMNormalize.SEQUENCE: "TM-score and GDT vs native are normalised by the prediction's full sequence length "
                          "(`--tm-normalize sequence`, as `TMscore native pred`: unobserved residues count as misses).",
}


def score_prediction(pdb_text: str, native: Any, numbering: Union[str, Numbering],
                     tm_normalize: Union[str, TMNormalize] = TMNormalize.NATIVE) -> Dict[str, float]:
    """TM-score, GDT-TS/HA, RMSD, lDDT of a predicted PDB against a native structure (or its text).

    Pairing: by residue number when ``numbering`` is ``"sequence"``, by
    sequence alignment when it is ``"author"``. ``tm_normalize``: see
    :class:`~ptq_protein.eval.tmscore.TMNormalize` (``native_length`` holds the length used).
    """
    from ptq_protein.eval.lddt import lddt
    from ptq_protein.eval.structure import as_structure
    from ptq_protein.eval.tmscore import tm_score

    pairing = "number" if Numbering(numbering) is Numbering.SEQUENCE else "sequence"
    pred, nat = as_structure(pdb_text), as_structure(native)
    tm = tm_score(pred, nat, pairing=pairing, normalize=tm_normalize)
    return {"tm_score": tm.tm_score, "gdt_ts": tm.gdt_ts, "gdt_ha": tm.gdt_ha, "rmsd": tm.rmsd,
            "n_aligned": tm.n_aligned, "native_length": tm.length,
            "lddt": lddt(pred, nat, pairing=pairing).lddt}


def _fold_and_score(model: nn.Module, bench: BenchmarkSet, target: Target, recipe: str, out_dir: Path,
                    options: RunOptions) -> Dict[str, Any]:
    from ptq_protein.eval.bench.folding import fold_one

    pdb_text, plddt, ca = fold_one(model, target.sequence, options.num_recycles)
    path = prediction_path(out_dir, "pdb", recipe, target.id, ".pdb")
    atomic_write_text(path, pdb_text)
    row: Dict[str, Any] = {"plddt": plddt, "pdb": path.relative_to(out_dir).as_posix()}
    if target.native_path is not None:
        row.update(score_prediction(pdb_text, bench.native_text(target), target.numbering, options.tm_normalize))
        if not math.isfinite(row["tm_score"]):  # an ok row's metrics are finite: this one is an error, rerun later
            raise ValueError(f"TM-score against the native is not finite for {target.id}")
    if recipe == FP_RECIPE:
        row.update(tm_fidelity=1.0, rmsd_vs_fp=0.0)
    else:
        row.update(_vs_fp(ca.numpy(), out_dir, target))
    return row


def _vs_fp(ca, out_dir: Path, target: Target) -> Dict[str, float]:
    """TM-score and RMSD of a quantized prediction's CA [L, 3] against the FP prediction's (same numbering)."""
    from ptq_protein.eval.structure import load_structure
    from ptq_protein.eval.tmscore import tm_score

    fp_path = prediction_path(out_dir, "pdb", FP_RECIPE, target.id, ".pdb")
    if not fp_path.exists():
        raise ValueError(f"FP prediction {fp_path} is missing, so {target.id} cannot be scored against FP; "
                         "rerun (fp runs first)")
    fp_ca = load_structure(fp_path).ca
    result = tm_score(ca, fp_ca)
    if not math.isfinite(result.tm_score):
        raise ValueError(f"TM-score against FP is not finite for {target.id}")
    return {"tm_fidelity": result.tm_score, "rmsd_vs_fp": result.rmsd}
