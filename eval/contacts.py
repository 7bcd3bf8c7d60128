"""Contact maps of native structures and the precision of predicted contact maps.

Following ESM's contact evaluation (``examples/contact_prediction.ipynb`` in
facebookresearch/esm): a virtual Cβ is placed from N, CA and C of every
residue (glycine included) at 1.522 Å from CA, N-CA-Cβ angle 1.927 rad and
C-N-CA-Cβ dihedral -2.143 rad; residues are in contact when their virtual Cβ
are closer than 8 Å. Precision is over the top ``floor(f * L)`` scored pairs
of each separation range, with two deliberate choices:

- ``L`` is the sequence length (the size of the predicted map). ESM's
  notebook takes it from residue 0's resolved distances, which is 0 when
  residue 0 is unresolved; the sequence length is what "P@L" means.
- ``floor(f * L)`` is computed in integers (the notebook multiplies floats);
  when fewer valid pairs exist the denominator stays ``floor(f * L)``.

Pairs involving an unresolved residue (not in the native, or lacking N, CA or
C) are left out of the ranking. Ties in the predicted scores are broken by
position (row-major over the upper triangle). Only the upper triangle
``pred[i, j], i < j`` is read.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ptq_protein.eval.align import global_align
from ptq_protein.eval.structure import Structure, as_structure
from ptq_protein.support.errors import InputError

__all__ = ["virtual_cb", "contact_map", "contact_precision", "SEPARATION_RANGES"]

CONTACT_DISTANCE = 8.0  # Å between virtual Cβ (ESM, CASP convention)
CB_BOND, CB_ANGLE, CB_DIHEDRAL = 1.522, 1.927, -2.143  # Å, rad, rad (ESM's contacts_from_pdb)
SEPARATION_RANGES = (("local", 3, 6), ("short", 6, 12), ("medium", 12, 24), ("long", 24, None))
FRACTIONS_TENTHS = tuple(range(1, 11))  # f = 0.1 ... 1.0 of L
MIN_LENGTH = 10  # below this floor(0.1 L) = 0 and P@L/10 is undefined


def virtual_cb(n: np.ndarray, ca: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Virtual Cβ [L, 3] from backbone N, CA, C [L, 3] (NaN where any is missing).

    The point at ``CB_BOND`` from CA with angle N-CA-Cβ ``CB_ANGLE`` and
    dihedral C-N-CA-Cβ ``CB_DIHEDRAL`` (the ``extend(C, N, CA, ...)`` of ESM).
    """
    def unit(v: np.ndarray) -> np.ndarray:
        return v / np.linalg.norm(v, axis=-1, keepdims=True)

    bc = unit(n - ca)
    normal = unit(np.cross(n - c, bc))
    frame = (bc, np.cross(normal, bc), normal)
    offsets = (CB_BOND * np.cos(CB_ANGLE),
               CB_BOND * np.sin(CB_ANGLE) * np.cos(CB_DIHEDRAL),
               -CB_BOND * np.sin(CB_ANGLE) * np.sin(CB_DIHEDRAL))
    return ca + sum(axis * offset for axis, offset in zip(frame, offsets))


def contact_map(native: Any, threshold: float = CONTACT_DISTANCE, chain: Optional[str] = None) -> np.ndarray:
    """Contacts [L, L] of a structure's residues: 1 contact, 0 none, -1 unresolved (int8)."""
    structure = as_structure(native, chain)
    cb = virtual_cb(structure.n, structure.ca, structure.c)
    dist = np.linalg.norm(cb[:, None, :] - cb[None, :, :], axis=-1)
    with np.errstate(invalid="ignore"):
        contacts = (dist < threshold).astype(np.int8)
    contacts[np.isnan(dist)] = -1
    return contacts


def contact_precision(pred: Any, native: Any, sequence: Optional[str] = None, *,
                      chain: Optional[str] = None, threshold: float = CONTACT_DISTANCE) -> dict:
    """Precision of a predicted contact map at L/5, L/2 and L per separation range.

    Parameters
    ----------
    pred : array [L, L]
        Contact probabilities (any score: only their order matters) over sequence positions.
    native : Structure, path or text
        By default native residue number n is sequence position n - 1.
    sequence : str, optional
        The predicted sequence (length L); native residues are then placed by
        a global alignment of the native's sequence to it.

    Returns
    -------
    dict
        ``{local,short,medium,long}_{P@L,P@L2,P@L5,AUC}``; separations
        local [3, 6), short [6, 12), medium [12, 24), long >= 24. A range with no
        native contact gives NaN (undefined), never 0.0.

    Examples
    --------
    >>> from ptq_protein.eval.structure import Structure
    >>> t = np.linspace(0, 12, 40)
    >>> ca = np.stack([6 * np.cos(t), 6 * np.sin(t), 1.5 * t], -1)
    >>> s = Structure.from_arrays(ca, n=ca + [0.5, 1.2, 0.3], c=ca + [1.0, -0.8, 0.6])
    >>> truth = contact_map(s).astype(float)
    >>> contact_precision(truth, s)["local_P@L5"]
    1.0
    """
    scores = _as_square(pred)
    length = scores.shape[0]
    if length < MIN_LENGTH:
        raise InputError(f"contact precision needs at least {MIN_LENGTH} residues, the map is {length}x{length}")
    structure = as_structure(native, chain)
    targets = _targets_on_sequence(structure, length, sequence)
    rows, cols = np.triu_indices(length, 1)
    separation = cols - rows
    resolved = targets[rows, cols] >= 0
    metrics = {}
    for name, low, high in SEPARATION_RANGES:
        in_range = resolved & (separation >= low) & (separation < (high if high is not None else length))
        metrics.update(_range_precisions(name, scores[rows, cols][in_range], targets[rows, cols][in_range], length))
    return metrics


def _range_precisions(name: str, scores: np.ndarray, truth: np.ndarray, length: int) -> dict:
    if not (truth == 1).any():  # no native contact in this range: precision is undefined, not 0
        return {f"{name}_{k}": float("nan") for k in ("P@L", "P@L2", "P@L5", "AUC")}
    order = np.argsort(-scores, kind="stable")
    hits = np.concatenate([[0], np.cumsum(truth[order] == 1)])
    precisions = []
    for tenths in FRACTIONS_TENTHS:
        top = tenths * length // 10
        precisions.append(hits[min(top, hits.size - 1)] / top)
    return {f"{name}_P@L": float(precisions[9]), f"{name}_P@L2": float(precisions[4]),
            f"{name}_P@L5": float(precisions[1]), f"{name}_AUC": float(np.mean(precisions))}


def _as_square(pred: Any) -> np.ndarray:
    if hasattr(pred, "detach"):
        pred = pred.detach().cpu().numpy()
    scores = np.asarray(pred, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[0] != scores.shape[1]:
        raise InputError(f"the predicted contact map must be a square [L, L] array, got shape {scores.shape}")
    if not np.isfinite(scores).all():
        raise InputError("the predicted contact map has NaN or infinite values")
    return scores


def _targets_on_sequence(structure: Structure, length: int, sequence: Optional[str]) -> np.ndarray:
    """Native contacts placed on sequence positions [L, L]; -1 where unknown."""
    positions = _sequence_positions(structure, length, sequence)
    native_contacts = contact_map(structure)
    targets = np.full((length, length), -1, dtype=np.int8)
    targets[np.ix_(positions[1], positions[1])] = native_contacts[np.ix_(positions[0], positions[0])]
    return targets


def _sequence_positions(structure: Structure, length: int, sequence: Optional[str]) -> tuple:
    """(native residue indices, their sequence positions)."""
    if sequence is not None:
        if len(sequence) != length:
            raise InputError(f"sequence has {len(sequence)} residues but the contact map is {length}x{length}")
        aln = global_align(structure.sequence, sequence)
        if aln.index_a.size == 0:
            raise InputError(f"{structure.source}: its sequence does not align to the given sequence")
        return aln.index_a, aln.index_b
    if any(structure.insertion_codes):
        raise InputError(f"{structure.source}: residues with insertion codes cannot be placed by number; "
                         "pass sequence= to place them by alignment")
    positions = structure.residue_numbers - 1
    outside = (positions < 0) | (positions >= length)
    if outside.any():
        first = structure.residue_numbers[outside][0]
        raise InputError(f"{structure.source}: residue number {first} is outside 1..{length} of the contact map; "
                         "pass sequence= to place the native by alignment")
    return np.arange(len(structure)), positions
