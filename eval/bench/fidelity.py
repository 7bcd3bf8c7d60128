"""Fidelity of a quantized model against its full-precision self (no biology involved).

For language models: relative error of the logits over residue positions and
top-1 agreement. For ESMFold: relative error of the final atom positions, CA
RMSD and TM-score of the quantized prediction against the FP prediction, and the
mean pLDDT difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

from ptq_protein.eval.bench.fold_progress import fold_progress
from ptq_protein.models.adapters import Batch, ModelAdapter, get_adapter
from ptq_protein.support.progress import progress as progress_of

__all__ = ["relative_error", "compare_models", "main_output", "fidelity_sequences", "Reference", "reference_outputs",
           "compare_to_reference"]


def relative_error(reference: torch.Tensor, other: torch.Tensor) -> float:
    """‖other − reference‖ / ‖reference‖ in float64."""
    ref, oth = reference.double(), other.double()
    denom = ref.norm()
    return float((oth - ref).norm() / denom) if denom > 0 else float((oth - ref).norm())


def main_output(output: Any) -> torch.Tensor:
    """The tensor fidelity is measured on: logits, ESMFold's final atom14 positions, or (a trunk without a
    head, ``EsmModel``) the last hidden state."""
    if isinstance(output, dict) or hasattr(output, "keys"):
        for key in ("positions", "logits", "last_hidden_state"):
            if key in output.keys() and output[key] is not None:
                value = output[key]
                return value[-1] if key == "positions" else value
    if hasattr(output, "logits"):
        return output.logits
    if torch.is_tensor(output):
        return output
    raise TypeError(f"cannot find logits, positions or last_hidden_state in a {type(output).__name__}")


def fidelity_sequences(lengths: Sequence[int], n: int) -> List[int]:
    """Indices of the ``n`` sequences around the median length (in length order).

    TM-score's d0 shrinks with length (d0(L) = 1.24·(L − 15)^(1/3) − 1.8, floored at
    0.5 Å): on a short chain ~1 Å of deviation already costs a third of the score, so
    a fidelity check on the shortest sequences reads as broken. The window of ``n``
    centred on the median of the length-sorted set never holds the ``n`` shortest
    when a longer sequence exists (ties keep the set's order).
    """
    if n < 1:
        raise ValueError(f"the number of fidelity sequences must be at least 1, got {n}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    start = (len(order) - n + 1) // 2 if len(order) > n else 0
    return order[start:start + n]


@dataclass
class Reference:
    """The FP model's output on one sequence, kept to compare several quantized models with."""

    batch: Batch
    output: torch.Tensor  # main_output(): logits, or the final atom14 positions
    plddt: Optional[torch.Tensor] = None
    logits: bool = True  # False: hidden states (no top-1 agreement)


@torch.no_grad()
def reference_outputs(fp_model: nn.Module, sequences: Sequence[str], adapter: ModelAdapter = None,
                      progress: bool = False) -> List[Reference]:
    """FP outputs on ``sequences``, one at a time (so no padding is involved); ``progress``: a line per step."""
    adapter = adapter or get_adapter(fp_model)
    if isinstance(sequences, str) or not sequences:
        raise TypeError("the fidelity check (compare_models, reference_outputs) takes a non-empty list of "
                        "sequences, not "
                        f"{'one string' if isinstance(sequences, str) else 'an empty list'}: pass [sequence]")
    sequences = adapter.validate(list(sequences), where="comparison")
    refs = []
    for seq in progress_of(sequences, "fidelity check: FP references", "sequences", show=progress):
        batch = adapter.make_batch([seq])
        with fold_progress(fp_model, f"fidelity check: FP fold of {len(seq)} residues", show=progress):
            out = adapter.forward(fp_model, batch)
        plddt = out["plddt"] if _is_structure(out) else None
        refs.append(Reference(batch, main_output(out), plddt, _has_logits(out)))
    return refs


@torch.no_grad()
def compare_to_reference(q_model: nn.Module, references: Sequence[Reference],
                         adapter: ModelAdapter = None, progress: bool = False) -> Dict[str, float]:
    """Mean fidelity metrics of ``q_model`` against FP outputs from :func:`reference_outputs`."""
    from ptq_protein.eval.tmscore import tm_score

    adapter = adapter or get_adapter(q_model)
    rel, agree, ca_rmsd, tm, dplddt = [], [], [], [], []
    for ref in progress_of(references, "fidelity check: quantized model", "sequences", show=progress):
        with fold_progress(q_model, "fidelity check: quantized fold", show=progress):
            out_q = adapter.forward(q_model, ref.batch)
        oth = main_output(out_q)
        if ref.plddt is not None:
            ca_fp, ca_q = ref.output[0, :, 1].double(), oth[0, :, 1].double()  # atom14 index 1 = CA
            rel.append(relative_error(ca_fp, ca_q))
            result = tm_score(ca_q.cpu().numpy(), ca_fp.cpu().numpy())  # the model may run on a GPU
            tm.append(result.tm_score)
            ca_rmsd.append(result.rmsd)
            dplddt.append(float(out_q["plddt"].mean() - ref.plddt.mean()))
        else:
            mask = ref.batch.token_mask[0]
            fp, q = ref.output[0][mask.to(ref.output.device)], oth[0][mask.to(oth.device)]
            rel.append(relative_error(fp, q))
            if ref.logits:
                agree.append(float((fp.argmax(-1) == q.argmax(-1)).double().mean()))
    out = {"relative_error": sum(rel) / len(rel)}
    if agree:
        out["top1_agreement"] = sum(agree) / len(agree)
    if tm:
        out.update(tm_vs_fp=sum(tm) / len(tm), ca_rmsd_vs_fp=sum(ca_rmsd) / len(ca_rmsd),
                   plddt_delta=sum(dplddt) / len(dplddt))
    return out


def compare_models(fp_model: nn.Module, q_model: nn.Module, sequences: Sequence[str],
                   adapter: ModelAdapter = None) -> Dict[str, float]:
    """Mean fidelity metrics over `sequences` (one at a time, so no padding is involved)."""
    adapter = adapter or get_adapter(fp_model)
    return compare_to_reference(q_model, reference_outputs(fp_model, sequences, adapter), adapter)


def _has_logits(output: Any) -> bool:
    return getattr(output, "logits", None) is not None or (hasattr(output, "keys") and "logits" in output.keys())


def _is_structure(output: Any) -> bool:
    return hasattr(output, "keys") and "positions" in output.keys()
