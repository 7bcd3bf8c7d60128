"""Fidelity of a quantized model against its full-precision self (no biology involved).

For language models: relative error of the logits over residue positions and
top-1 agreement. For ESMFold: relative error of the final atom positions, CA
RMSD and TM-score of the quantized prediction against the FP prediction, and the
mean pLDDT difference.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch
from torch import nn

from ptq_protein.models.adapters import ModelAdapter, get_adapter

__all__ = ["relative_error", "compare_models", "reference_outputs", "compare_to_reference", "main_output"]


def relative_error(reference: torch.Tensor, other: torch.Tensor) -> float:
    """‖other − reference‖ / ‖reference‖ in float64."""
    ref, oth = reference.double(), other.double()
    denom = ref.norm()
    return float((oth - ref).norm() / denom) if denom > 0 else float((oth - ref).norm())


def main_output(output: Any) -> torch.Tensor:
    """The tensor fidelity is measured on: logits, or ESMFold's final atom14 positions."""
    if isinstance(output, dict) or hasattr(output, "keys"):
        for key in ("positions", "logits"):
            if key in output.keys() and output[key] is not None:
                value = output[key]
                return value[-1] if key == "positions" else value
    if hasattr(output, "logits"):
        return output.logits
    if torch.is_tensor(output):
        return output
    raise TypeError(f"cannot find logits or positions in a {type(output).__name__}")


@torch.no_grad()
def compare_models(fp_model: nn.Module, q_model: nn.Module, sequences: Sequence[str],
                   adapter: ModelAdapter = None) -> Dict[str, float]:
    """Mean fidelity metrics over ``sequences`` (one at a time, so no padding is involved)."""
    adapter = adapter or get_adapter(fp_model)
    return compare_to_reference(reference_outputs(fp_model, sequences, adapter), q_model, sequences, adapter)


@torch.no_grad()
def reference_outputs(fp_model: nn.Module, sequences: Sequence[str], adapter: ModelAdapter = None) -> List[Any]:
    """The FP model's outputs on ``sequences``, one at a time.

    Lets a caller that quantizes in place (the CLI) keep only these outputs
    instead of a second copy of the float model.
    """
    adapter = adapter or get_adapter(fp_model)
    return [adapter.forward(fp_model, adapter.make_batch([seq])) for seq in sequences]


@torch.no_grad()
def compare_to_reference(references: Sequence[Any], q_model: nn.Module, sequences: Sequence[str],
                         adapter: ModelAdapter = None) -> Dict[str, float]:
    """:func:`compare_models` against outputs from :func:`reference_outputs`."""
    adapter = adapter or get_adapter(q_model)
    rel, agree, ca_rmsd, tm, dplddt = [], [], [], [], []
    for seq, out_fp in zip(sequences, references):
        batch = adapter.make_batch([seq])
        out_q = adapter.forward(q_model, batch)
        ref, oth = main_output(out_fp), main_output(out_q)
        if hasattr(out_fp, "keys") and "positions" in out_fp.keys():
            ca_fp, ca_q = ref[0, :, 1].double(), oth[0, :, 1].double()  # atom14 index 1 = CA
            rel.append(relative_error(ca_fp, ca_q))
            from ptq_protein.eval.tmscore import tm_score

            result = tm_score(ca_q.numpy(), ca_fp.numpy())
            tm.append(result.tm_score)
            ca_rmsd.append(result.rmsd)
            dplddt.append(float(out_q["plddt"].mean() - out_fp["plddt"].mean()))
        else:
            mask = batch.token_mask[0]
            ref, oth = ref[0][mask.to(ref.device)], oth[0][mask.to(oth.device)]
            rel.append(relative_error(ref, oth))
            agree.append(float((ref.argmax(-1) == oth.argmax(-1)).double().mean()))
    out = {"relative_error": sum(rel) / len(rel)}
    if agree:
        out["top1_agreement"] = sum(agree) / len(agree)
    if tm:
        out.update(tm_vs_fp=sum(tm) / len(tm), ca_rmsd_vs_fp=sum(ca_rmsd) / len(ca_rmsd),
                   plddt_delta=sum(dplddt) / len(dplddt))
    return out
