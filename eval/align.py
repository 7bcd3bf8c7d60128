"""Residue correspondence between two chains: by residue number or by a global sequence alignment.

The alignment is Biopython's :class:`Bio.Align.PairwiseAligner` (C, Gotoh's
affine-gap Needleman-Wunsch): BLOSUM62 substitution scores, a gap of length k
costs ``11 + (k - 1) * 1`` (BLAST's protein defaults, in Biopython's convention
where the opening penalty covers the first residue), and end gaps are free, so a
native that lacks terminal residues of the full sequence aligns without penalty.
Where several alignments share the best score, the first one Biopython returns
is taken. Until 0.1 this was a numpy re-implementation whose ties preferred a
match, then a gap in ``b``; the two pair every one of the 322 bundled
cameo2022/cameo139 natives with its sequence identically (about 10x faster now),
and differ only between co-optimal paths on unrelated random sequences.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import lru_cache
from typing import Union

import numpy as np

from ptq_protein.support.errors import InputError

__all__ = ["Pairing", "SequenceAlignment", "global_align", "pair_residues"]

GAP_OPEN = 11  # BLAST blastp default (BLOSUM62)
GAP_EXTEND = 1


class Pairing(str, enum.Enum):
    """How residues of a model are paired with residues of a native."""

    NUMBER = "number"  # equal residue number and insertion code (the TMscore program's default)
    SEQUENCE = "sequence"  # a global sequence alignment of the two chains' sequences

    @classmethod
    def parse(cls, value: Union[str, "Pairing"]) -> "Pairing":
        return parse_choice(cls, value, "pairing")


def parse_choice(cls, value, name: str):
    """``cls(value)`` for a str Enum, or one InputError naming ``name`` and the choices."""
    try:
        return cls(value)
    except ValueError as err:
        choices = ", ".join(repr(m.value) for m in cls)
        raise InputError(f"{name}={value!r} is not one of {choices}") from err


@dataclass(frozen=True, eq=False)
class SequenceAlignment:
    """Aligned positions of ``a`` and ``b`` (gap columns left out) and the alignment score."""

    index_a: np.ndarray  # [K] int, increasing
    index_b: np.ndarray  # [K] int, increasing
    score: int
    n_identical: int

    def __post_init__(self) -> None:
        if self.index_a.shape != self.index_b.shape:
            raise ValueError("index_a and index_b must have the same length")


def global_align(a: str, b: str, gap_open: int = GAP_OPEN, gap_extend: int = GAP_EXTEND) -> SequenceAlignment:
    """Global alignment of two protein sequences (free end gaps, BLOSUM62, affine gaps).

    Parameters
    ----------
    a, b : str
        One-letter sequences; letters outside BLOSUM62 score as ``X``.
    gap_open, gap_extend : int
        Positive penalties; a gap of length k costs ``gap_open + (k - 1) * gap_extend``.

    Returns
    -------
    SequenceAlignment
        ``index_a[k]`` is aligned with ``index_b[k]`` (matches and mismatches).

    Examples
    --------
    >>> aln = global_align("MKTAYIAK", "TAYIAK")
    >>> aln.index_a.tolist(), aln.index_b.tolist()
    ([2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5])
    """
    if gap_open < gap_extend or gap_extend < 0:
        raise InputError(f"need gap_open >= gap_extend >= 0, got {gap_open} and {gap_extend}")
    if not a or not b:
        raise InputError("cannot align an empty sequence")
    best = _aligner(gap_open, gap_extend).align(_known_letters(a), _known_letters(b))[0]
    index_a, index_b = _aligned_columns(best.aligned)
    ident = int(sum(a[p].upper() == b[q].upper() for p, q in zip(index_a.tolist(), index_b.tolist())))
    return SequenceAlignment(index_a=index_a, index_b=index_b, score=int(round(best.score)), n_identical=ident)


def pair_residues(model, native, pairing: Union[str, Pairing] = Pairing.NUMBER) -> tuple:
    """Index pairs ``(model_index, native_index)`` of corresponding residues.

    Parameters
    ----------
    model, native : Structure
    pairing : "number" or "sequence"
        ``number``: equal residue number and insertion code. ``sequence``: a
        :func:`global_align` of the two sequences (for natives in author numbering).

    Returns
    -------
    tuple of np.ndarray [K]
        Positions into ``model`` and ``native``, in native order.
    """
    pairing = Pairing.parse(pairing)
    if pairing is Pairing.SEQUENCE:
        for s in (model, native):
            if set(s.sequence) <= {"X"}:
                raise InputError(f"{s.source}: pairing='sequence' needs residue names, but its sequence is unknown "
                                 "(give sequence= to Structure.from_arrays, or use pairing='number')")
        aln = global_align(model.sequence, native.sequence)
        return aln.index_a, aln.index_b
    where = {key: i for i, key in enumerate(zip(model.residue_numbers.tolist(), model.insertion_codes))}
    pairs = [(where[key], j) for j, key in enumerate(zip(native.residue_numbers.tolist(), native.insertion_codes))
             if key in where]
    if not pairs:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    index = np.asarray(pairs, dtype=np.int64)
    return index[:, 0], index[:, 1]


@lru_cache(maxsize=8)
def _aligner(gap_open: int, gap_extend: int):
    from Bio.Align import PairwiseAligner, substitution_matrices

    return PairwiseAligner(mode="global", substitution_matrix=substitution_matrices.load("BLOSUM62"),
                           open_gap_score=-gap_open, extend_gap_score=-gap_extend, end_gap_score=0)


@lru_cache(maxsize=1)
def _alphabet() -> frozenset:
    from Bio.Align import substitution_matrices

    return frozenset(substitution_matrices.load("BLOSUM62").alphabet)


def _known_letters(seq: str) -> str:
    """Upper case, with letters BLOSUM62 lacks (U, O, J, gaps) read as ``X``."""
    known = _alphabet()
    return "".join(ch if ch in known else "X" for ch in seq.upper())


def _aligned_columns(blocks) -> tuple:
    """Per-residue indices from Biopython's aligned blocks ``([[a0, a1], ...], [[b0, b1], ...])``."""
    if len(blocks[0]) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    index_a = np.concatenate([np.arange(s, e) for s, e in blocks[0]]).astype(np.int64)
    index_b = np.concatenate([np.arange(s, e) for s, e in blocks[1]]).astype(np.int64)
    return index_a, index_b
