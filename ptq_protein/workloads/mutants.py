"""Mutant names (``A24G``, ``A24G:C30T``) parsed against a wild-type sequence, and the list of all single mutants.

fair-esm's ``examples/variant-prediction/predict.py`` reads ``A24G`` as wild-type
``A``, position ``24 - offset_idx`` (0-based) in ``--sequence``, mutant ``G``, and
asserts that the sequence holds ``A`` there. Here the same arithmetic applies, but
a mismatch is an :class:`~ptq_protein.support.errors.InputError` naming the mutant, so a
whole DMS file is checked before any model runs. Multi-mutants join single
substitutions with ``:`` (ProteinGym's convention); each position may appear once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from ptq_protein.data.fasta import ESM_AMINO_ACIDS, STANDARD_AMINO_ACIDS
from ptq_protein.support.errors import InputError

__all__ = ["Substitution", "Mutant", "parse_mutant", "parse_mutants", "offsets_also_matching", "single_mutants",
           "mutate",
           "AMINO_ACIDS", "DEFAULT_OFFSET"]

#: The substitutions scored for "every single mutant" (and the heatmap's columns), in this order.
AMINO_ACIDS = STANDARD_AMINO_ACIDS
#: Mutant positions are 1-based in ``--sequence`` by default (ProteinGym's files); predict.py's default is 0.
DEFAULT_OFFSET = 1
_SUBSTITUTION = re.compile(r"^([A-Za-z])(-?\d+)([A-Za-z])$")

Mutant = Tuple["Substitution", ...]  # one or more substitutions at distinct positions


@dataclass(frozen=True)
class Substitution:
    """One residue change: ``index`` is 0-based in the wild-type sequence."""

    wt: str
    index: int
    mt: str


def parse_mutant(text: str, sequence: str, offset_idx: int = DEFAULT_OFFSET) -> Mutant:
    """The substitutions of `text` (`A24G` or `A24G:C30T`) checked against `sequence`.

    `offset_idx`: the number the first residue of `sequence` has in `text`
    (predict.py's `--offset-idx`: `index = position - offset_idx`).

    >>> parse_mutant("K2A:T3G", "MKTAY")
    (Substitution(wt='K', index=1, mt='A'), Substitution(wt='T', index=2, mt='G'))
    """
    parts = str(text).strip().split(":")
    subs = tuple(_substitution(part.strip(), text, sequence, offset_idx) for part in parts)
    indices = [s.index for s in subs]
    if len(set(indices)) != len(indices):
        raise InputError(f"mutant {text!r} changes one position twice; list each position once")
    return subs


def parse_mutants(texts: Sequence[str], sequence: str, offset_idx: int = DEFAULT_OFFSET,
                  where: Optional[Callable[[int], str]] = None) -> List[Mutant]:
    """:func:`parse_mutant` of each text; ``where(i)`` (e.g. ``"dms.csv line 7: "``) prefixes text i's error."""
    out = []
    for i, text in enumerate(texts):
        try:
            out.append(parse_mutant(text, sequence, offset_idx))
        except InputError as err:
            raise InputError(f"{where(i) if where else ''}{err}") from err
    return out


def offsets_also_matching(mutants: Sequence[Mutant], sequence: str, offset_idx: int, reach: int = 3) -> List[int]:
    """Other ``--offset-idx`` values (within ``reach``) under which every substitution's wild type matches too:
    the wild-type check cannot tell them from ``offset_idx`` (mutants only inside runs such as ``KKKK``)."""
    subs = [sub for mutant in mutants for sub in mutant]
    return [offset_idx + shift for shift in range(-reach, reach + 1) if shift and subs and all(
        0 <= sub.index - shift < len(sequence) and sequence[sub.index - shift] == sub.wt for sub in subs)]


def single_mutants(sequence: str, offset_idx: int = DEFAULT_OFFSET) -> List[str]:
    """Every substitution of every position by another of the 20 amino acids (19 per standard residue), in order.

    >>> single_mutants("MK")[:2], len(single_mutants("MK"))
    (['M1A', 'M1C'], 38)
    """
    return [f"{wt}{i + offset_idx}{aa}" for i, wt in enumerate(sequence) for aa in AMINO_ACIDS if aa != wt]


def mutate(sequence: str, mutant: Mutant) -> str:
    """``sequence`` with the substitutions of ``mutant`` applied."""
    residues = list(sequence)
    for sub in mutant:
        residues[sub.index] = sub.mt
    return "".join(residues)


def _substitution(part: str, text: str, sequence: str, offset_idx: int) -> Substitution:
    match = _SUBSTITUTION.match(part)
    if not match:
        raise InputError(f"mutant {text!r}: {part!r} is not a substitution like A24G (wild type, position, mutant; "
                         "join several with ':')")
    wt, position, mt = match[1].upper(), int(match[2]), match[3].upper()
    for letter in (wt, mt):
        if letter not in ESM_AMINO_ACIDS:
            raise InputError(f"mutant {text!r}: {letter!r} is not an amino-acid letter ({ESM_AMINO_ACIDS})")
    index = position - offset_idx
    if not 0 <= index < len(sequence):
        raise InputError(f"mutant {text!r}: position {position} is outside the sequence (positions "
                         f"{offset_idx}..{len(sequence) - 1 + offset_idx} with --offset-idx {offset_idx})")
    if sequence[index] != wt:
        raise InputError(f"mutant {text!r}: the sequence has {sequence[index]!r} at position {position}, not {wt!r}; "
                         "check --sequence and --offset-idx (the number of its first residue)")
    return Substitution(wt, index, mt)
