"""Fold sequences with an ESMFold model (float or quantized) and write one PDB per sequence."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence, Tuple

import torch
from torch import nn

from ptq_protein.io_utils import atomic_write_text

__all__ = ["fold_one", "fold_to_pdbs", "require_esmfold"]

log = logging.getLogger(__name__)


def require_esmfold(model: nn.Module) -> None:
    if not hasattr(model, "infer") or not hasattr(model, "output_to_pdb"):
        raise ValueError(f"folding needs an ESMFold model (EsmForProteinFolding), got {type(model).__name__}; "
                         "use tiny-esmfold, esmfold, or an artifact quantized from one")


@torch.no_grad()
def fold_one(model: nn.Module, sequence: str, num_recycles: Optional[int] = None) -> Tuple[str, float, torch.Tensor]:
    """(PDB text with pLDDT 0-100 in the B-factors, mean pLDDT, CA coordinates [L, 3])."""
    from ptq_protein.models.adapters import HFEsmFoldAdapter

    adapter = HFEsmFoldAdapter(model)
    output = adapter.forward(model, adapter.make_batch([sequence]), num_recycles=num_recycles)
    output = {k: v for k, v in output.items() if torch.is_tensor(v)}
    plddt = output["plddt"]
    if float(plddt.max()) <= 1.0:  # transformers reports pLDDT in [0, 1]; PDB convention is 0-100
        output["plddt"] = plddt * 100.0
    pdb = model.output_to_pdb(output)[0]
    ca = output["positions"][-1, 0, :, 1].float().cpu()
    return pdb, float(output["plddt"][0, :, 1].mean()), ca


def fold_to_pdbs(model: nn.Module, records: Sequence[Tuple[str, str]], out_dir: Path,
                 num_recycles: Optional[int] = None, progress: bool = False) -> Dict[str, float]:
    """Fold each (id, sequence), write ``out_dir/<id>.pdb`` atomically; returns mean pLDDT per id."""
    require_esmfold(model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    items: Iterable = records
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(records, desc="folding", unit="seq")
    plddts = {}
    for seq_id, seq in items:
        pdb, plddt, _ = fold_one(model, seq, num_recycles)
        atomic_write_text(out_dir / f"{_safe_name(seq_id)}.pdb", pdb)
        plddts[seq_id] = plddt
    return plddts


def _safe_name(seq_id: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in seq_id) or "sequence"
