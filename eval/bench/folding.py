"""Fold sequences with an ESMFold model (float or quantized) and write one PDB per sequence."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from ptq_protein.eval.bench.fold_budget import FoldRefused, planned_fold
from ptq_protein.file_reads import read_json
from ptq_protein.io_utils import atomic_write_text, check_out_path, file_lock, folder_lock, safe_stem
from ptq_protein.progress import progress as progress_of

__all__ = ["fold_one", "fold_to_pdbs", "require_esmfold", "FoldRefused"]

log = logging.getLogger(__name__)


def require_esmfold(model: nn.Module) -> None:
    if not hasattr(model, "infer") or not hasattr(model, "output_to_pdb"):
        raise ValueError(f"folding needs an ESMFold model (EsmForProteinFolding), got {type(model).__name__}; "
                         "use tiny-esmfold, esmfold, or an artifact quantized from one")


@torch.no_grad()
def fold_one(model: nn.Module, sequence: str, num_recycles: Optional[int] = None,
             max_memory: Optional[int] = None) -> Tuple[str, float, torch.Tensor]:
    """(PDB text with pLDDT 0-100 in the B-factors, mean pLDDT, CA coordinates [L, 3]).

    Checked first against the memory model (:func:`~ptq_protein.eval.bench.fold_budget.planned_fold`):
    the largest chunk size within ``max_memory`` bytes (default: what the machine has available)
    is used, and a sequence that cannot fit raises :class:`FoldRefused` before anything runs.
    """
    from ptq_protein.models.adapters import HFEsmFoldAdapter

    adapter = HFEsmFoldAdapter(model)
    with planned_fold(model, len(sequence), max_memory):
        output = adapter.forward(model, adapter.make_batch([sequence]), num_recycles=num_recycles)
    # float32 for the PDB writer: transformers converts through numpy, which has no bfloat16
    output = {k: v.float() if v.is_floating_point() else v for k, v in output.items() if torch.is_tensor(v)}
    plddt = output["plddt"]
    if float(plddt.max()) <= 1.0:  # transformers reports pLDDT in [0, 1]; PDB convention is 0-100
        output["plddt"] = plddt * 100.0
    pdb = model.output_to_pdb(output)[0]
    ca = output["positions"][-1, 0, :, 1].float().cpu()
    return pdb, float(output["plddt"][0, :, 1].mean()), ca


def fold_to_pdbs(model: nn.Module, records: Sequence[Tuple[str, str]], out_dir: Path,
                 num_recycles: Optional[int] = None, progress: bool = False, force: bool = False,
                 max_memory: Optional[int] = None, refused: Optional[Dict[str, str]] = None,
                 shard_tag: Optional[str] = None) -> Dict[str, Tuple[float, Path]]:
    """Fold each (id, sequence), write one PDB each atomically; returns {id: (mean pLDDT, path written)}.

    A sequence that cannot fit in ``max_memory`` bytes (:func:`fold_one`) is not folded and
    the others go on; its one-line reason goes into ``refused`` (id -> reason) when given,
    else :class:`FoldRefused` is raised after the others are written.

    File names come from :func:`~ptq_protein.io_utils.safe_stem` (``a/b`` and ``a_b``
    get different files); ``out_dir/fold_index.json`` records id -> file. Existing PDBs
    are refused before anything is folded, unless ``force`` and the index of an earlier
    fold in this folder lists them (``force`` never replaces a file this tool did not write).

    ``shard_tag`` (``K-of-N``): this run folds one share of a FASTA beside the others' runs
    into the same folder; each shard holds its own lock, and the index is updated under a
    short shared lock (re-read, one entry added), so concurrent shards keep every entry.
    """
    require_esmfold(model)
    out_dir = Path(out_dir)
    check_out_path(out_dir / INDEX_NAME, force=True, what="folder")  # a usable folder, not under a file
    index_path = out_dir / INDEX_NAME
    index = _read_index(index_path)
    paths = {seq_id: out_dir / f"{safe_stem(seq_id)}.pdb" for seq_id, _ in records}
    clash = [p for p in paths.values() if p.exists() and not (force and p.name in index.values())]
    if clash:
        hint = "choose a new --out folder"
        if not force:
            hint += ", or pass --force to replace PDBs an earlier fold wrote"
        raise FileExistsError(f"{clash[0]} already exists ({len(clash)} PDB file(s) in the way); {hint}")
    out_dir.mkdir(parents=True, exist_ok=True)
    held = folder_lock(out_dir) if shard_tag is None else \
        file_lock(out_dir / f".fold-{shard_tag}.lock", wait=False, purpose=f"shard {shard_tag} of {out_dir}")
    with held:  # one fold per folder (or per shard of it) at a time
        reasons: Dict[str, str] = {} if refused is None else refused
        written = _fold_all(model, records, paths, index_path, (num_recycles, max_memory), progress, reasons)
    if reasons and refused is None:
        raise FoldRefused(f"{len(reasons)} sequence(s) not folded: " + "; ".join(reasons.values()))
    return written


def _fold_all(model: nn.Module, records: Sequence[Tuple[str, str]], paths: Dict[str, Path], index_path: Path,
              run: Tuple[Optional[int], Optional[int]], progress: bool,
              refused: Dict[str, str]) -> Dict[str, Tuple[float, Path]]:
    items = progress_of(records, "folding", "sequences", show=progress)
    written = {}
    for seq_id, seq in items:
        try:
            pdb, plddt, _ = fold_one(model, seq, *run)
        except FoldRefused as err:  # this one cannot fit: the others go on
            refused[seq_id] = f"{seq_id}: {err}"
            log.debug("not folded: %s", refused[seq_id])
            continue
        _record(index_path, seq_id, paths[seq_id].name)  # before the PDB: a PDB in the folder is always ours
        atomic_write_text(paths[seq_id], pdb)
        written[seq_id] = (plddt, paths[seq_id])
    return written


INDEX_NAME = "fold_index.json"


def _record(index_path: Path, seq_id: str, name: str) -> None:
    """Add ``seq_id -> name`` to the index: re-read under a lock, so other shards' entries are kept."""
    with file_lock(index_path.parent / f".{INDEX_NAME}.lock", purpose=str(index_path)):
        index = _read_index(index_path)
        index[seq_id] = name
        atomic_write_text(index_path, json.dumps(index, indent=2, sort_keys=True) + "\n")


def _read_index(path: Path) -> Dict[str, str]:
    if not path.exists():
        return {}
    index = read_json(path, "move it away or choose a new --out folder")
    if not isinstance(index, dict) or not all(isinstance(v, str) for v in index.values()):
        raise ValueError(f"{path} is not a fold index (id -> file name); move it away or choose a new --out folder")
    return index
