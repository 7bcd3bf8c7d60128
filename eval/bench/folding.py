"""Fold sequences with an ESMFold model (float or quantized) and write one PDB per sequence."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import nn

from ptq_protein.eval.bench.fold_budget import FoldRefused, planned_fold
from ptq_protein.eval.bench.fold_progress import fold_progress
from ptq_protein.models.fold_memory import streamed_units
from ptq_protein.models.mapped import mapped_file_of, release_after_forward
from ptq_protein.support.errors import InputError
from ptq_protein.support.file_reads import read_json
from ptq_protein.support.io_utils import atomic_write_text, check_out_path, file_lock, folder_lock, safe_stem
from ptq_protein.support.progress import progress as progress_of
from ptq_protein.workloads.run_manifest import RunManifest

__all__ = ["fold_one", "fold_output", "fold_to_pdbs", "check_fold_folder", "MANIFEST", "require_esmfold",
           "esmfold_input_notes", "pae_json", "pae_path", "Folded", "FoldRefused"]

log = logging.getLogger(__name__)


def require_esmfold(model: nn.Module) -> None:
    if not hasattr(model, "infer") or not hasattr(model, "output_to_pdb"):
        raise ValueError(f"folding needs an ESMFold model (EsmForProteinFolding), got {type(model).__name__}; "
                         "use tiny-esmfold, esmfold, or an artifact quantized from one")


class Folded(NamedTuple):
    """What :func:`fold_to_pdbs` wrote for one sequence."""

    plddt: float  # mean pLDDT, 0-100
    path: Path  # the PDB
    ptm: Optional[float]  # ESMFold's predicted TM-score, 0-1
    pae: Optional[Path]  # <stem>.pae.json; None where the model holds no PAE (int8 pair activations)


@torch.no_grad()
def fold_output(model: nn.Module, sequence: str, num_recycles: Optional[int] = None,
                max_memory: Optional[int] = None, progress: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """ESMFold's outputs for one sequence, in float32, pLDDT on 0-100.

    A model whose weights live in a file mapping (a mapped artifact or ``.pt`` file) hands each stem
    layer's and trunk block's pages back after its forward (:func:`streamed_units`): the fold holds
    about one block's weights, reading the others from the page cache when they run.
    Checked first against the memory model (:func:`~ptq_protein.eval.bench.fold_budget.planned_fold`):
    the largest chunk size within ``max_memory`` bytes (default: what the machine has available)
    is used, and a sequence that cannot fit raises :class:`FoldRefused` before anything runs.
    ``progress``: the label of a log line at least every 30 s of a long fold
    (:func:`~ptq_protein.eval.bench.fold_progress.fold_progress`); None: silent.
    """
    from ptq_protein.models.adapters import HFEsmFoldAdapter

    adapter = HFEsmFoldAdapter(model)
    with planned_fold(model, len(sequence), max_memory, num_recycles), \
            release_after_forward(model, mapped_file_of(model), units=streamed_units(model)), \
            fold_progress(model, progress or "", num_recycles, show=progress is not None):
        output = adapter.forward(model, adapter.make_batch([sequence]), num_recycles=num_recycles)
    # float32 for the PDB writer: transformers converts through numpy, which has no bfloat16
    output = {k: v.float() if v.is_floating_point() else v for k, v in output.items() if torch.is_tensor(v)}
    plddt = output["plddt"]
    if float(plddt.max()) <= 1.0:  # transformers reports pLDDT in [0, 1]; PDB convention is 0-100
        output["plddt"] = plddt * 100.0
    return output


def fold_one(model: nn.Module, sequence: str, num_recycles: Optional[int] = None,
             max_memory: Optional[int] = None) -> Tuple[str, float, torch.Tensor]:
    """(PDB text with pLDDT 0-100 in the B-factors, mean pLDDT, CA coordinates [L, 3]); see :func:`fold_output`."""
    output = fold_output(model, sequence, num_recycles, max_memory)
    ca = output["positions"][-1, 0, :, 1].float().cpu()
    return model.output_to_pdb(output)[0], _mean_plddt(output), ca


def esmfold_input_notes(sequence: str) -> str:
    """What ESMFold makes of letters it has no residue type for, in words ("" for none); positions are kept."""
    from transformers.models.esm.openfold_utils import residue_constants

    known = set(residue_constants.restypes)
    unknown = sorted({ch for ch in sequence if ch not in known})
    if not unknown:
        return ""
    count = sum(1 for ch in sequence if ch not in known)
    letters = "/".join(unknown)
    return (f"{count} residue{'s' if count > 1 else ''} {letters} folded as unknown (X; the PDB has no atoms for "
            "them), the others keep their numbers")


def check_fold_outputs(out_dir: Path, records: Sequence[Tuple[str, str]], force: bool = False) -> Dict[str, Path]:
    """Everything about ``out_dir`` and ``records`` that can be refused before the model loads; returns
    {id: its PDB path}.

    Refuses (one line each) an ``out_dir`` that is a file or under one, a sequence with no residue ESMFold
    knows (all X: no atom to write), a PDB or PAE path that is a folder or a link, and an existing PDB that
    ``force`` may not replace (only those ``fold_index.json`` lists).
    """
    out_dir = Path(out_dir)
    check_out_path(out_dir, force=True, what="folder")  # refused in words (a read-only place, under a file)
    check_out_path(out_dir / INDEX_NAME, force=True, what="folder")  # a usable folder, not a file itself
    for seq_id, seq in records:
        if not esmfold_known(seq):
            raise InputError(f"sequence {seq_id!r} has no residue ESMFold knows (only {'/'.join(sorted(set(seq)))}): "
                             "it predicts no atom for unknown residues, so there is no structure to write; remove "
                             "it from the FASTA")
    index = _read_index(out_dir / INDEX_NAME)
    paths = {seq_id: out_dir / f"{safe_stem(seq_id)}.pdb" for seq_id, _ in records}
    for path in (p for pdb in paths.values() for p in (pdb, pae_path(pdb))):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise FileExistsError(f"{path} is {'a link' if path.is_symlink() else 'a folder'}, where fold writes a "
                                  "file (--force replaces only files an earlier fold wrote); move it away")
    clash = [p for pdb in paths.values() for p in (pdb, pae_path(pdb))
             if p.exists() and not (force and pdb.name in index.values())]
    if clash:
        hint = "choose a new --out folder"
        if not force:
            hint += ", or pass --force to replace PDBs an earlier fold wrote"
        raise FileExistsError(f"{clash[0]} already exists ({len(clash)} PDB file(s) in the way); {hint}")
    return paths


def esmfold_known(sequence: str) -> bool:
    """Whether ``sequence`` holds at least one residue type ESMFold predicts atoms for."""
    from transformers.models.esm.openfold_utils import residue_constants

    return any(ch in residue_constants.restypes for ch in sequence)


def fold_to_pdbs(model: nn.Module, records: Sequence[Tuple[str, str]], out_dir: Path,
                 num_recycles: Optional[int] = None, progress: bool = False, force: bool = False,
                 max_memory: Optional[int] = None, refused: Optional[Dict[str, str]] = None,
                 shard_tag: Optional[str] = None, identity: Optional[Mapping[str, Any]] = None) -> Dict[str, Folded]:
    """Fold each (id, sequence), write one PDB (and its PAE, :func:`pae_json`) each atomically; returns
    {id: :class:`Folded`}.

    A sequence that cannot fit in ``max_memory`` bytes (:func:`fold_one`) is not folded and
    the others go on; its one-line reason goes into ``refused`` (id -> reason) when given,
    else :class:`FoldRefused` is raised after the others are written.

    File names come from :func:`~ptq_protein.support.io_utils.safe_stem` (``a/b`` and ``a_b``
    get different files); ``out_dir/fold_index.json`` records id -> file. Existing PDBs
    are refused before anything is folded, unless ``force`` and the index of an earlier
    fold in this folder lists them (``force`` never replaces a file this tool did not write).

    ``shard_tag`` (``K-of-N``): this run folds one share of a FASTA beside the others' runs
    into the same folder; each shard holds its own lock, and the index is updated under a
    short shared lock (re-read, one entry added), so concurrent shards keep every entry.

    ``identity`` (the CLI's: model, options, FASTA digest) is recorded in ``fold_run.json``
    by the first run into the folder and compared by every later one (another shard, a
    ``--force`` rerun): folds of another model, seed or option are refused, never mixed.
    """
    require_esmfold(model)
    out_dir = Path(out_dir)
    if identity is not None:
        check_fold_folder(out_dir, identity)
    index_path = out_dir / INDEX_NAME
    paths = check_fold_outputs(out_dir, records, force)
    out_dir.mkdir(parents=True, exist_ok=True)
    if identity is not None:
        _manifest(out_dir).bind(identity)
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
              refused: Dict[str, str]) -> Dict[str, Folded]:
    items = progress_of(records, "folding", "sequences", show=progress)
    written = {}
    for seq_id, seq in items:
        try:
            output = fold_output(model, seq, *run, progress=f"folding {seq_id} ({len(seq)} residues)"
                                 if progress else None)
        except FoldRefused as err:  # this one cannot fit: the others go on
            refused[seq_id] = f"{seq_id}: {err}"
            log.debug("not folded: %s", refused[seq_id])
            continue
        pdb = model.output_to_pdb(output)[0]  # before the index lists it: a failure here leaves no entry
        _record(index_path, seq_id, paths[seq_id].name)  # before the PDB: a PDB in the folder is always ours
        atomic_write_text(paths[seq_id], pdb)
        pae = pae_json(output)
        if pae is not None:
            atomic_write_text(pae_path(paths[seq_id]), pae)
        ptm = float(output["ptm"]) if "ptm" in output else None
        written[seq_id] = Folded(_mean_plddt(output), paths[seq_id], ptm,
                                 None if pae is None else pae_path(paths[seq_id]))
    return written


def pae_path(pdb: Path) -> Path:
    return pdb.with_name(pdb.stem + ".pae.json")


def pae_json(output: Dict[str, torch.Tensor]) -> Optional[str]:
    """The predicted aligned error [L, L] (Å) as AlphaFold DB's PAE file writes it; None where the model has none."""
    pae = output.get("predicted_aligned_error")
    if pae is None:
        return None
    rows = [[round(v, 2) for v in row] for row in pae[0].tolist()]
    return json.dumps([{"predicted_aligned_error": rows,
                        "max_predicted_aligned_error": round(float(output["max_predicted_aligned_error"]), 2)}])


def _mean_plddt(output: Dict[str, torch.Tensor]) -> float:
    return float(output["plddt"][0, :, 1].mean())  # CA pLDDT


INDEX_NAME = "fold_index.json"
MANIFEST = "fold_run.json"


def _manifest(out_dir: Path) -> RunManifest:
    return RunManifest(out_dir, MANIFEST, "ptq-protein fold", "folds")


def check_fold_folder(out_dir: Path, identity: Mapping[str, Any],
                      model_hint: Optional[Mapping[str, Any]] = None) -> None:
    """Refuse a folder whose folds another run made (``fold_run.json`` differs from ``identity``; ``model_hint``:
    the part of the model's identity known before it loads), or whose index no identity vouches for."""
    if not _manifest(out_dir).check(identity, model_hint) and (out_dir / INDEX_NAME).exists():
        raise InputError(f"--out {out_dir} holds folds of a run that recorded no identity ({INDEX_NAME} without "
                         f"{MANIFEST}: an older ptq-protein), so they could be another model's; choose a new --out "
                         "folder")


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
