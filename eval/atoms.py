"""Residue and atom constants shared by the structure readers and scorers.

The atom37 layout is the one AlphaFold/OpenFold use and that transformers'
``EsmForProteinFolding`` writes (``openfold_utils.residue_constants.atom_types``),
so predicted all-atom coordinates can be compared slot by slot with natives.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

__all__ = [
    "ATOM37_NAMES",
    "ATOM37_INDEX",
    "CA_INDEX",
    "N_INDEX",
    "C_INDEX",
    "THREE_TO_ONE",
    "UNKNOWN_RESIDUE",
    "AMBIGUOUS_ATOM_SWAPS",
    "MODIFIED_RESIDUE_PARENTS",
    "ATOM_RENAMES",
]

# OpenFold residue_constants.atom_types (also transformers.models.esm.openfold_utils).
ATOM37_NAMES: tuple[str, ...] = (
    "N", "CA", "C", "CB", "O", "CG", "CG1", "CG2", "OG", "OG1", "SG", "CD",
    "CD1", "CD2", "ND1", "ND2", "OD1", "OD2", "SD", "CE", "CE1", "CE2", "CE3",
    "NE", "NE1", "NE2", "OE1", "OE2", "CH2", "NH1", "NH2", "OH", "CZ", "CZ2",
    "CZ3", "NZ", "OXT",
)
ATOM37_INDEX: Mapping[str, int] = MappingProxyType({name: i for i, name in enumerate(ATOM37_NAMES)})
N_INDEX, CA_INDEX, C_INDEX = ATOM37_INDEX["N"], ATOM37_INDEX["CA"], ATOM37_INDEX["C"]

# The 20 standard amino acids (IUPAC); anything else reads as UNKNOWN_RESIDUE.
THREE_TO_ONE: Mapping[str, str] = MappingProxyType({
    "ALA": "A", "ARG": "R", "ASN": "N", "ASP": "D", "CYS": "C", "GLN": "Q",
    "GLU": "E", "GLY": "G", "HIS": "H", "ILE": "I", "LEU": "L", "LYS": "K",
    "MET": "M", "PHE": "F", "PRO": "P", "SER": "S", "THR": "T", "TRP": "W",
    "TYR": "Y", "VAL": "V",
})
UNKNOWN_RESIDUE = "X"

# HETATM residues read as their parent amino acid (selenomethionine is how many
# crystal structures of methionine-containing proteins are deposited).
MODIFIED_RESIDUE_PARENTS: Mapping[str, str] = MappingProxyType({"MSE": "MET"})
# Atom names of a modified residue that map onto an atom37 slot of the parent.
ATOM_RENAMES: Mapping[str, Mapping[str, str]] = MappingProxyType({"MSE": MappingProxyType({"SE": "SD"})})

# Chemically equivalent atoms whose names are arbitrary: OpenFold's
# residue_atom_renaming_swaps plus Arg NH1/NH2 (lDDT, Mariani et al. 2013).
AMBIGUOUS_ATOM_SWAPS: Mapping[str, tuple[tuple[str, str], ...]] = MappingProxyType({
    "ASP": (("OD1", "OD2"),),
    "GLU": (("OE1", "OE2"),),
    "PHE": (("CD1", "CD2"), ("CE1", "CE2")),
    "TYR": (("CD1", "CD2"), ("CE1", "CE2")),
    "ARG": (("NH1", "NH2"),),
})
