"""``eval contacts``: ESM-2 contact precision by separation range, FP vs each quantized recipe.

Per target and recipe the row holds :func:`ptq_protein.eval.contacts.contact_precision`
(``{local,short,medium,long}_{P@L,P@L2,P@L5,AUC}``; long-range P@L is the
headline) and ``mae_vs_fp``, the mean absolute difference of the contact
probabilities from the FP map of the same target (the quantization error
alone). Maps are saved as ``OUT/contacts/<recipe>/<target>.npy`` (float32
[L, L]); the FP ones are read back for ``mae_vs_fp``, so a resumed run needs no
FP recompute.

Native residues are placed by number for ``numbering="sequence"`` sets and by
sequence alignment for ``"author"`` sets.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import numpy as np
import torch
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
from ptq_protein.models.lm_outputs import eager_attention
from ptq_protein.support.io_utils import atomic_write_bytes

__all__ = ["CONTACT_COLUMNS", "CONTACT_METRICS", "evaluate_contacts", "predict_contacts"]

logger = logging.getLogger(__name__)

_RANGES = ("local", "short", "medium", "long")  # ptq_protein.eval.contacts.SEPARATION_RANGES
_STATS = ("P@L", "P@L2", "P@L5", "AUC")
CONTACT_COLUMNS = (("target", "recipe", "status", "length") + tuple(f"{r}_{s}" for r in _RANGES for s in _STATS)
                   + ("mae_vs_fp", "seconds", "contacts", "output_sha256"))
CONTACT_METRICS = (
    MetricSpec("long_P@L", "long-range P@L"),
    MetricSpec("long_P@L5", "long-range P@L5"),
    MetricSpec("medium_P@L", "medium-range P@L"),
    MetricSpec("short_P@L", "short-range P@L"),
    MetricSpec("mae_vs_fp", "mean |p - p_FP|", higher_is_better=False, compare_to_fp=False, limits=None),
)


def evaluate_contacts(model: nn.Module, bench: BenchmarkSet, recipes: Sequence[str], out_dir: Union[str, Path],
                      options: RunOptions = RunOptions(), run_info: Optional[Mapping[str, Any]] = None,
                      note: str = "", ranks: Ranks = SINGLE) -> Dict[str, Any]:
    """Predict and score contacts of every target under each recipe; write results, summary and plot.

    Parameters
    ----------
    model : fair-esm ``ESM2`` or transformers ``EsmForMaskedLM`` / ``EsmModel`` (float; never modified).
    bench, recipes, out_dir, options, run_info, note : as in
        :func:`ptq_protein.eval.bench.structure_task.evaluate_structure`.

    Returns
    -------
    dict with ``results``, ``summary``, ``plot`` paths and ``counts``.
    """
    from ptq_protein.models.adapters import get_adapter

    _check_family(get_adapter(model).family)
    out_dir = Path(out_dir)
    info = {"command": "eval contacts", **(run_info or {}), **run_identity(model, options)}
    with open_run(out_dir, info, CONTACT_COLUMNS, ranks) as store:
        return _run(model, bench, recipes, out_dir, store, options, note, ranks)


def _run(model: nn.Module, bench: BenchmarkSet, recipes: Sequence[str], out_dir: Path, store: ResultsStore,
         options: RunOptions, note: str, ranks: Ranks) -> Dict[str, Any]:
    def evaluate(recipe: str, qmodel: nn.Module, target: Target) -> Dict[str, Any]:
        return _predict_and_score(qmodel, bench, target, recipe, out_dir)

    counts = run_recipes(model, bench, recipes, store, evaluate, options, ranks)
    if not ranks.is_main:  # rank 0 writes the summary, from every rank's rows
        return {"results": store.path, "counts": counts}
    paths = write_outputs(out_dir, store.rows(), normalize_recipes(recipes), bench.ids, CONTACT_METRICS,
                          title=f"eval contacts: {bench.name}", note=note)
    return {**paths, "results": store.path, "counts": counts}


@torch.no_grad()
def predict_contacts(model: nn.Module, sequence: str) -> np.ndarray:
    """Contact probabilities [L, L] (float32) of one sequence from an ESM-2 language model.

    fair-esm: ``model(tokens, return_contacts=True)["contacts"]``; transformers:
    ``model.predict_contacts(input_ids, attention_mask)``. Both drop BOS/EOS.
    """
    from ptq_protein.models.adapters import get_adapter

    adapter = get_adapter(model)
    _check_family(adapter.family)
    batch = adapter.make_batch([sequence])
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in batch.inputs.items()}
    if adapter.family == "fair-esm":
        contacts = model(inputs["tokens"], return_contacts=True)["contacts"]
    else:
        with eager_attention(model):
            contacts = model.predict_contacts(inputs["input_ids"], inputs["attention_mask"])
    result = contacts[0].float().cpu().numpy()
    if result.shape != (len(sequence), len(sequence)):
        raise RuntimeError(f"contact map has shape {result.shape}, expected {(len(sequence),) * 2}")
    return result


def _predict_and_score(model: nn.Module, bench: BenchmarkSet, target: Target, recipe: str,
                       out_dir: Path) -> Dict[str, Any]:
    from ptq_protein.eval.contacts import contact_precision

    pred = predict_contacts(model, target.sequence)
    path = prediction_path(out_dir, "contacts", recipe, target.id, ".npy")
    atomic_write_bytes(path, _npy_bytes(pred))
    row: Dict[str, Any] = {"contacts": path.relative_to(out_dir).as_posix()}
    if target.native_path is not None:
        by_alignment = target.numbering is Numbering.AUTHOR
        row.update(contact_precision(pred, bench.native_text(target),
                                     sequence=target.sequence if by_alignment else None))
    row["mae_vs_fp"] = 0.0 if recipe == FP_RECIPE else _mae_vs_fp(pred, out_dir, target)
    return row


def _mae_vs_fp(pred: np.ndarray, out_dir: Path, target: Target) -> float:
    fp_path = prediction_path(out_dir, "contacts", FP_RECIPE, target.id, ".npy")
    if not fp_path.exists():
        raise ValueError(f"FP contact map {fp_path} is missing, so {target.id} cannot be compared with FP; "
                         "rerun (fp runs first)")
    fp = np.load(fp_path, allow_pickle=False)
    if fp.shape != pred.shape:
        raise ValueError(f"FP contact map {fp_path} has shape {fp.shape}, this one {pred.shape}")
    return float(np.abs(pred.astype(np.float64) - fp).mean())


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)
    return buffer.getvalue()


def _check_family(family: str) -> None:
    if family not in ("fair-esm", "hf-esm"):
        raise ValueError(f"eval contacts needs an ESM-2 language model (fair-esm ESM2 or transformers "
                         f"EsmForMaskedLM), got a {family} model; use e.g. esm2_t33_650M_UR50D or tiny-esm2")
