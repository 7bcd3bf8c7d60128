"""Residue correspondence between two chains: by residue number or by a global sequence alignment.

The alignment is Needleman-Wunsch with affine gaps (Gotoh 1982) in numpy:
BLOSUM62 substitution scores, a gap of length k costs ``11 + (k - 1) * 1``
(BLAST's protein defaults, in Biopython's convention where the opening
penalty covers the first residue), and end gaps are free, so a native that
lacks terminal residues of the full sequence aligns without penalty. Ties in
the traceback prefer a match, then a gap in ``b``, then a gap in ``a``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import lru_cache
from typing import Union

import numpy as np

from ptq_protein.errors import InputError

__all__ = ["Pairing", "SequenceAlignment", "global_align", "pair_residues"]

GAP_OPEN = 11  # BLAST blastp default (BLOSUM62)
GAP_EXTEND = 1
_DIAG, _UP, _LEFT = 0, 1, 2  # traceback moves: match, gap in b (consume a), gap in a (consume b)
_NEG = np.iinfo(np.int64).min // 4


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
    sub = _substitution_rows(a.upper(), b.upper())
    h, e_ptr, f_ptr, h_ptr = _fill(sub, gap_open, gap_extend)
    i, j = _best_end(h)
    index_a, index_b = _traceback(h_ptr, e_ptr, f_ptr, i, j)
    ident = int(sum(a[p].upper() == b[q].upper() for p, q in zip(index_a.tolist(), index_b.tolist())))
    return SequenceAlignment(index_a=index_a, index_b=index_b, score=int(h[i, j]), n_identical=ident)


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


@lru_cache(maxsize=1)
def _blosum62() -> tuple:
    from Bio.Align import substitution_matrices

    matrix = substitution_matrices.load("BLOSUM62")
    letters = "".join(matrix.alphabet)
    return letters, np.asarray(matrix, dtype=np.int64)


def _substitution_rows(a: str, b: str) -> np.ndarray:
    """[len(a), len(b)] BLOSUM62 scores."""
    letters, matrix = _blosum62()
    lookup = {ch: i for i, ch in enumerate(letters)}
    unknown = lookup["X"]
    ia = np.fromiter((lookup.get(ch, unknown) for ch in a), dtype=np.int64, count=len(a))
    ib = np.fromiter((lookup.get(ch, unknown) for ch in b), dtype=np.int64, count=len(b))
    return matrix[np.ix_(ia, ib)]


def _fill(sub: np.ndarray, gap_open: int, gap_extend: int) -> tuple:
    """Gotoh fill, one row at a time; horizontal gaps by a prefix maximum.

    A horizontal gap never starts from a horizontal-gap state (extending is no
    worse, as ``gap_open >= gap_extend``), so ``F[i, j] = max_k<j (G[i, k] -
    open - (j - 1 - k) * extend)`` with ``G`` the best of match and vertical gap.
    """
    n, m = sub.shape
    h = np.zeros((n + 1, m + 1), dtype=np.int64)  # free leading gaps: zero borders
    e = np.full(m + 1, _NEG, dtype=np.int64)
    h_ptr = np.zeros((n + 1, m + 1), dtype=np.int8)
    e_ptr = np.zeros((n + 1, m + 1), dtype=bool)  # True: the vertical gap extends the one above
    f_ptr = np.zeros((n + 1, m + 1), dtype=bool)  # True: the horizontal gap extends the one on the left
    ramp = np.arange(m + 1, dtype=np.int64) * gap_extend
    for i in range(1, n + 1):
        opened, extended = h[i - 1] - gap_open, e - gap_extend
        e_ptr[i] = extended > opened
        e = np.maximum(opened, extended)
        diag = np.concatenate(([_NEG], h[i - 1, :-1] + sub[i - 1]))
        g = np.maximum(diag, e)
        g[0] = 0
        best_start = np.maximum.accumulate(g + ramp)
        f = np.concatenate(([_NEG], best_start[:-1] - gap_open - ramp[:-1]))
        f_ptr[i, 2:] = (f[1:-1] - gap_extend) > (g[1:-1] - gap_open)
        row = np.maximum(g, f)
        row[0] = 0
        h[i] = row
        h_ptr[i] = np.where(diag >= np.maximum(e, f), _DIAG, np.where(e >= f, _UP, _LEFT))
    return h, e_ptr, f_ptr, h_ptr


def _best_end(h: np.ndarray) -> tuple:
    """End cell of the best alignment with free trailing gaps (prefers the corner on ties)."""
    n, m = h.shape[0] - 1, h.shape[1] - 1
    j_best = int(np.argmax(h[n, ::-1]))
    i_best = int(np.argmax(h[::-1, m]))
    j_best, i_best = m - j_best, n - i_best
    if h[n, j_best] >= h[i_best, m]:
        return n, j_best
    return i_best, m


def _traceback(h_ptr: np.ndarray, e_ptr: np.ndarray, f_ptr: np.ndarray, i: int, j: int) -> tuple:
    index_a, index_b = [], []
    state = int(h_ptr[i, j])
    while i > 0 and j > 0:
        if state == _DIAG:
            index_a.append(i - 1)
            index_b.append(j - 1)
            i, j = i - 1, j - 1
            state = int(h_ptr[i, j])
        elif state == _UP:
            extends = bool(e_ptr[i, j])
            i -= 1
            state = _UP if extends else int(h_ptr[i, j])
        else:
            extends = bool(f_ptr[i, j])
            j -= 1
            state = _LEFT if extends else int(h_ptr[i, j])
    return np.asarray(index_a[::-1], dtype=np.int64), np.asarray(index_b[::-1], dtype=np.int64)
