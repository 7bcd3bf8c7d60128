"""lDDT: the local distance difference test (Mariani et al., Bioinformatics 29, 2722, 2013).

Superposition-free: every distance of the native shorter than the inclusion
radius (15 Å) between atoms of different residues is checked in the model,
and counts as preserved at each threshold (0.5, 1, 2, 4 Å) its difference is
below. A residue's score is the preserved fraction over the distances its
atoms take part in; the global score is that fraction over all distances
(a ratio of sums, as the original program and AlphaFold compute it).

Modes: ``ca`` uses CA atoms only; ``all`` uses every heavy atom present in
the native (atom37 layout), resolving the arbitrary naming of symmetric
side-chain atoms (Asp, Glu, Phe, Tyr, Arg) per model residue by the naming
that preserves more distances. Distances whose model atom is missing (an
unpaired residue, a missing side chain) count as not preserved.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from ptq_protein.eval.align import Pairing, pair_residues
from ptq_protein.eval.atoms import AMBIGUOUS_ATOM_SWAPS, ATOM37_INDEX, CA_INDEX, THREE_TO_ONE
from ptq_protein.eval.structure import Structure, as_structure
from ptq_protein.support.errors import InputError

__all__ = ["LDDTResult", "LDDTMode", "lddt"]

INCLUSION_RADIUS = 15.0  # Å (Mariani et al. 2013)
THRESHOLDS = (0.5, 1.0, 2.0, 4.0)  # Å (Mariani et al. 2013)

_SWAP_BY_LETTER = {THREE_TO_ONE[name]: [(ATOM37_INDEX[a], ATOM37_INDEX[b]) for a, b in pairs]
                   for name, pairs in AMBIGUOUS_ATOM_SWAPS.items()}


class LDDTMode(str, enum.Enum):
    AUTO = "auto"  # all-atom when both structures have atoms beyond CA, else CA
    CA = "ca"
    ALL = "all"


@dataclass(frozen=True, eq=False)
class LDDTResult:
    """Global and per-residue lDDT of a model against a native (per native residue)."""

    lddt: float
    per_residue: np.ndarray  # [L_native], NaN where a native residue has no distance to score
    residue_labels: tuple  # native residue numbers with insertion codes
    mode: str  # "ca" or "all"
    n_distances: int  # native distances scored (unordered atom pairs)

    def __post_init__(self) -> None:
        if not 0.0 <= self.lddt <= 1.0:
            raise ValueError(f"lddt={self.lddt} is outside [0, 1]")
        if self.per_residue.shape != (len(self.residue_labels),):
            raise ValueError("per_residue must have one value per native residue")

    def to_dict(self, per_residue: bool = True) -> dict:
        out = {"lddt": self.lddt, "mode": self.mode, "n_distances": self.n_distances,
               "n_residues": len(self.residue_labels)}
        if per_residue:
            out["per_residue"] = {label: (None if np.isnan(v) else float(v))
                                  for label, v in zip(self.residue_labels, self.per_residue.tolist())}
        return out


def lddt(model: Any, native: Any, pairing: Union[str, Pairing] = "number", *,
         mode: Union[str, LDDTMode] = "auto", model_chain: Optional[str] = None,
         native_chain: Optional[str] = None, cutoff: float = INCLUSION_RADIUS) -> LDDTResult:
    """lDDT of `model` against `native`.

    Parameters
    ----------
    model, native : Structure, path, PDB/mmCIF text, or CA array [L, 3]
    pairing : "number" or "sequence"
        How model residues are matched to native residues (see `pair_residues`).
    mode : "auto", "ca" or "all"
    cutoff : float
        Inclusion radius in Å on native distances.

    Returns
    -------
    LDDTResult

    Examples
    --------
    >>> ca = np.cumsum(np.random.default_rng(0).normal(size=(30, 3)), axis=0) * 2
    >>> lddt(ca, ca).lddt
    1.0
    """
    model_s, native_s = as_structure(model, model_chain), as_structure(native, native_chain)
    mode = _resolve_mode(mode, model_s, native_s)
    im, jn = pair_residues(model_s, native_s, pairing)
    if im.size == 0:
        raise InputError(f"{model_s.source} and {native_s.source} have no residues in common")
    slots = [CA_INDEX] if mode is LDDTMode.CA else list(range(37))
    ref = native_s.atom37[:, slots]
    ref_mask = native_s.atom37_mask[:, slots]
    mob = np.full(ref.shape, np.nan)
    mob_src = model_s.atom37[im][:, slots]
    mob[jn] = np.where(model_s.atom37_mask[im][:, slots, None], mob_src, np.nan)
    mob[~ref_mask] = np.nan
    pairs = _native_pairs(ref, ref_mask, cutoff)
    if pairs[0].size == 0:
        raise InputError(f"{native_s.source}: no distances shorter than {cutoff} Å between residues to score")
    if mode is LDDTMode.ALL:
        mob = _resolve_ambiguous_atoms(mob, ref, pairs, native_s.sequence, len(slots))
    return _score(mob, ref, pairs, native_s, mode, len(slots))


def _resolve_mode(mode: Union[str, LDDTMode], model: Structure, native: Structure) -> LDDTMode:
    try:
        mode = LDDTMode(mode)
    except ValueError as err:
        raise InputError(f"mode={mode!r} is not one of {[m.value for m in LDDTMode]}") from err
    if mode is LDDTMode.AUTO:
        return LDDTMode.ALL if (model.has_side_chains and native.has_side_chains) else LDDTMode.CA
    if mode is LDDTMode.ALL and not (model.has_side_chains and native.has_side_chains):
        raise InputError("mode='all' needs atoms beyond CA in both structures; use mode='ca'")
    return mode


def _native_pairs(ref: np.ndarray, ref_mask: np.ndarray, cutoff: float) -> tuple:
    """Flat atom indices (a, b), a < b, of native atoms in different residues closer than ``cutoff``."""
    from scipy.spatial import cKDTree

    flat = ref.reshape(-1, 3)
    present = np.flatnonzero(ref_mask.reshape(-1))
    tree = cKDTree(flat[present])
    local = tree.query_pairs(r=cutoff, output_type="ndarray").reshape(-1, 2)
    a, b = present[local[:, 0]], present[local[:, 1]]
    n_slots = ref.shape[1]
    d = np.linalg.norm(flat[a] - flat[b], axis=-1)
    keep = (a // n_slots != b // n_slots) & (d < cutoff)
    return a[keep], b[keep], d[keep]


def _preserved(mob_flat: np.ndarray, a: np.ndarray, b: np.ndarray, d_ref: np.ndarray) -> np.ndarray:
    """Fraction of thresholds [P] each distance is preserved within (0 where a model atom is missing)."""
    d_mob = np.linalg.norm(mob_flat[a] - mob_flat[b], axis=-1)
    diff = np.abs(d_mob - d_ref)
    with np.errstate(invalid="ignore"):
        hits = sum((diff < t).astype(np.float64) for t in THRESHOLDS)
    return np.nan_to_num(hits, nan=0.0) / len(THRESHOLDS)


def _resolve_ambiguous_atoms(mob: np.ndarray, ref: np.ndarray, pairs: tuple, sequence: str, n_slots: int) -> np.ndarray:
    """Swap symmetric atom names of a model residue where the swap preserves more distances.

    Residues are decided one after another, each against the current naming
    of the others (as OpenStructure's lDDT does).
    """
    a, b, d_ref = pairs
    ends = np.concatenate([a, b])
    order = np.argsort(ends, kind="stable")
    sorted_ends = ends[order]
    pair_of = np.concatenate([np.arange(a.size), np.arange(a.size)])[order]
    mob = mob.copy()
    for i, letter in enumerate(sequence):
        swaps = _SWAP_BY_LETTER.get(letter)
        if not swaps or np.isnan(mob[i, [s for pair in swaps for s in pair]]).any():
            continue
        atoms = np.asarray([i * n_slots + s for pair in swaps for s in pair])
        lo, hi = np.searchsorted(sorted_ends, atoms), np.searchsorted(sorted_ends, atoms, side="right")
        touching = np.unique(np.concatenate([pair_of[start:end] for start, end in zip(lo, hi)]))
        if touching.size == 0:
            continue
        sel = (a[touching], b[touching], d_ref[touching])
        swapped = mob.copy()
        for s, t in swaps:
            swapped[i, [s, t]] = mob[i, [t, s]]
        if _preserved(swapped.reshape(-1, 3), *sel).sum() > _preserved(mob.reshape(-1, 3), *sel).sum():
            mob = swapped
    return mob


def _score(mob: np.ndarray, ref: np.ndarray, pairs: tuple, native: Structure, mode: LDDTMode,
           n_slots: int) -> LDDTResult:
    a, b, d_ref = pairs
    score = _preserved(mob.reshape(-1, 3), a, b, d_ref)
    length = len(native)
    res_a, res_b = a // n_slots, b // n_slots
    total = np.bincount(res_a, minlength=length) + np.bincount(res_b, minlength=length)
    kept = np.bincount(res_a, weights=score, minlength=length) + np.bincount(res_b, weights=score, minlength=length)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_residue = np.where(total > 0, kept / np.maximum(total, 1), np.nan)
    return LDDTResult(lddt=float(score.sum() / score.size), per_residue=per_residue,
                      residue_labels=tuple(native.residue_labels()), mode=mode.value, n_distances=int(score.size))
