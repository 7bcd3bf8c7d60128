"""One protein chain as arrays: the input every scorer in ``ptq_protein.eval`` takes.

:func:`load_structure` reads PDB, gzipped PDB and mmCIF files (or their text)
with Biopython; :meth:`Structure.from_arrays` wraps coordinate arrays. Reading
rules, chosen to agree with the TMscore program where it has one:

- the first model only; the first chain that has amino-acid residues unless
  ``chain`` names another;
- HETATM residues (ligands, water, modified residues) are skipped, except
  selenomethionine (MSE), which reads as methionine with SE in the SD slot;
- alternate locations: altloc ``A`` (else the first listed), as TMscore does;
- insertion codes are kept (``52`` and ``52A`` are two residues);
- missing residues are simply absent; a residue without CA keeps NaN there;
- a chain with no CA atom at all is an error.
"""

from __future__ import annotations

import io
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import numpy as np

from ptq_protein.eval.atoms import (
    ATOM37_INDEX,
    ATOM37_NAMES,
    ATOM_RENAMES,
    C_INDEX,
    CA_INDEX,
    MODIFIED_RESIDUE_PARENTS,
    N_INDEX,
    THREE_TO_ONE,
    UNKNOWN_RESIDUE,
)
from ptq_protein.eval.coords import atom37_from_arrays
from ptq_protein.support.errors import InputError
from ptq_protein.support.file_reads import gunzip, regular_file

__all__ = ["Structure", "load_structure", "as_structure"]

logger = logging.getLogger(__name__)

PathOrText = Union[str, "os.PathLike[str]"]
_GZIP_MAGIC = b"\x1f\x8b"
_CIF_SUFFIXES = (".cif", ".mmcif")


@dataclass(frozen=True, eq=False)
class Structure:
    """One chain: residue identifiers, sequence and atom37 coordinates.

    Attributes
    ----------
    chain_id : str
    residue_numbers : np.ndarray of int, shape [L]
    insertion_codes : tuple of str, length L ("" when none)
    sequence : str, length L (one-letter codes, "X" for unknown residues)
    atom37 : np.ndarray of float64, shape [L, 37, 3] (0 where the mask is False, as in OpenFold)
    atom37_mask : np.ndarray of bool, shape [L, 37]
    source : str, where it came from (for messages)
    """

    chain_id: str
    residue_numbers: np.ndarray
    insertion_codes: tuple
    sequence: str
    atom37: np.ndarray
    atom37_mask: np.ndarray
    source: str = field(default="<arrays>")

    def __post_init__(self) -> None:
        numbers = np.asarray(self.residue_numbers)
        if numbers.ndim != 1 or (numbers.size and not np.issubdtype(numbers.dtype, np.integer)):
            raise InputError(f"{self.source}: residue_numbers must be a 1-D integer array, got {numbers.dtype} "
                             f"{numbers.shape}")
        length = numbers.shape[0]
        coords = np.asarray(self.atom37, dtype=np.float64)
        mask = np.asarray(self.atom37_mask, dtype=bool)
        if coords.shape != (length, 37, 3) or mask.shape != (length, 37):
            raise InputError(
                f"{self.source}: atom37 must be [L, 37, 3] and atom37_mask [L, 37] with L={length}, "
                f"got {coords.shape} and {mask.shape}")
        if len(self.sequence) != length or len(self.insertion_codes) != length:
            raise InputError(f"{self.source}: sequence ({len(self.sequence)}) and insertion_codes "
                             f"({len(self.insertion_codes)}) must have one entry per residue ({length})")
        if not np.isfinite(coords[mask]).all():
            raise InputError(f"{self.source}: atom37 has non-finite coordinates where atom37_mask is True")
        keys = list(zip(numbers.tolist(), self.insertion_codes))
        if len(set(keys)) != length:
            raise InputError(f"{self.source}: residue numbers (with insertion codes) must be unique")
        coords = np.where(mask[..., None], coords, 0.0)
        for name, value in (("residue_numbers", numbers.astype(np.int64)), ("atom37", coords), ("atom37_mask", mask)):
            value = np.array(value)
            value.setflags(write=False)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "insertion_codes", tuple(str(code) for code in self.insertion_codes))

    def __len__(self) -> int:
        return int(self.residue_numbers.shape[0])

    def __repr__(self) -> str:
        return f"Structure(source={self.source!r}, chain={self.chain_id!r}, length={len(self)})"

    def _atom(self, index: int) -> np.ndarray:
        return np.where(self.atom37_mask[:, index, None], self.atom37[:, index], np.nan)

    @property
    def ca(self) -> np.ndarray:
        """CA coordinates, [L, 3], NaN where missing."""
        return self._atom(CA_INDEX)

    @property
    def n(self) -> np.ndarray:
        """Backbone N coordinates, [L, 3], NaN where missing."""
        return self._atom(N_INDEX)

    @property
    def c(self) -> np.ndarray:
        """Backbone C coordinates, [L, 3], NaN where missing."""
        return self._atom(C_INDEX)

    @property
    def has_side_chains(self) -> bool:
        """True when any atom other than CA is present (all-atom scoring is possible)."""
        others = np.delete(self.atom37_mask, CA_INDEX, axis=1)
        return bool(others.any())

    def residue_labels(self) -> list:
        """Residue numbers with insertion codes as strings ("52", "52A")."""
        return [f"{number}{code}" for number, code in zip(self.residue_numbers.tolist(), self.insertion_codes)]

    def select(self, index: Sequence[int]) -> "Structure":
        """The residues at ``index`` (positions, in the given order)."""
        index = np.asarray(index, dtype=np.int64)
        return Structure(
            chain_id=self.chain_id, residue_numbers=self.residue_numbers[index],
            insertion_codes=tuple(self.insertion_codes[i] for i in index.tolist()),
            sequence="".join(self.sequence[i] for i in index.tolist()),
            atom37=self.atom37[index], atom37_mask=self.atom37_mask[index], source=self.source)

    @classmethod
    def from_arrays(
        cls,
        ca: Any = None,
        sequence: Optional[str] = None,
        residue_numbers: Optional[Sequence[int]] = None,
        *,
        n: Any = None,
        c: Any = None,
        atom37: Any = None,
        atom37_mask: Any = None,
        insertion_codes: Optional[Sequence[str]] = None,
        chain_id: str = "A",
        source: str = "<arrays>",
    ) -> "Structure":
        """Wrap coordinate arrays (numpy or torch, any device) as a :class:`Structure`.

        Parameters
        ----------
        ca : array [L, 3], optional
            CA coordinates; rows with NaN are missing residues' CA.
        sequence : str, optional
            One-letter sequence (default all "X").
        residue_numbers : sequence of int [L], optional
            Default 1..L, so that two arrays pair row by row under ``pairing="number"``.
        n, c : array [L, 3], optional
            Backbone N and C (needed for contact maps).
        atom37, atom37_mask : array [L, 37, 3] and [L, 37], optional
            Full atom37 coordinates; the mask defaults to "finite".

        Examples
        --------
        >>> s = Structure.from_arrays(np.zeros((3, 3)) + np.arange(3)[:, None] * 3.8)
        >>> s.residue_numbers.tolist()
        [1, 2, 3]
        """
        coords, mask = atom37_from_arrays(ca, n, c, atom37, atom37_mask, source)
        length = coords.shape[0]
        numbers = np.arange(1, length + 1) if residue_numbers is None else np.asarray(residue_numbers)
        if numbers.shape != (length,):
            raise InputError(f"{source}: residue_numbers has shape {numbers.shape}, expected ({length},)")
        seq = UNKNOWN_RESIDUE * length if sequence is None else str(sequence).upper()
        codes = ("",) * length if insertion_codes is None else tuple(insertion_codes)
        return cls(chain_id=chain_id, residue_numbers=numbers.astype(np.int64), insertion_codes=codes,
                   sequence=seq, atom37=coords, atom37_mask=mask, source=source)


def as_structure(value: Any, chain: Optional[str] = None) -> Structure:
    """A :class:`Structure` from a Structure, a file path / PDB or mmCIF text, or a CA array [L, 3]."""
    if isinstance(value, Structure):
        if chain is not None and chain != value.chain_id:
            raise InputError(f"{value.source}: chain {chain!r} was asked for but this structure is chain "
                             f"{value.chain_id!r}")
        return value
    if isinstance(value, (str, os.PathLike)):
        return load_structure(value, chain=chain)
    return Structure.from_arrays(value)


def load_structure(path_or_text: PathOrText, chain: Optional[str] = None) -> Structure:
    """Read one chain of a PDB, PDB.gz or mmCIF file (or of PDB / mmCIF text).

    Parameters
    ----------
    path_or_text : str or PathLike
        A file path, or the file's text (anything containing a newline is text).
    chain : str, optional
        Chain identifier (author chain, ``auth_asym_id`` in mmCIF); default the
        first chain with amino-acid residues.

    Returns
    -------
    Structure
        Residues of the first model's chosen chain in file order.

    Raises
    ------
    InputError
        Unreadable file, unknown chain, no amino-acid residues, or no CA atom.
    """
    text, source, is_cif = _read_text(path_or_text)
    parsed = _parse(text, source, is_cif)
    models = list(parsed)
    if not models:
        raise InputError(f"{source}: no atoms found (is this a PDB or mmCIF file?)")
    if len(models) > 1:
        logger.info("%s: %d models, using the first", source, len(models))
    residues_by_chain = {ch.id: _protein_residues(ch) for ch in models[0]}
    chain_id = _choose_chain(residues_by_chain, chain, source)
    return _build(residues_by_chain[chain_id], chain_id, source)


def _read_text(path_or_text: PathOrText) -> tuple:
    """(text, source label, is_mmcif) from a path or from file contents."""
    if isinstance(path_or_text, str) and "\n" in path_or_text:
        return path_or_text, "<text>", _looks_like_cif(path_or_text)
    if not isinstance(path_or_text, (str, os.PathLike)):
        raise TypeError(f"load_structure takes a file path or the file's text, got {type(path_or_text).__name__}")
    path = regular_file(path_or_text, "structure file")
    raw = path.read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        raw = gunzip(raw, str(path), "re-download or re-compress it")
    text = raw.decode("utf-8", errors="replace")
    suffixes = [s.lower() for s in path.suffixes]
    is_cif = any(s in _CIF_SUFFIXES for s in suffixes) or _looks_like_cif(text)
    return text, str(path), is_cif


def _looks_like_cif(text: str) -> bool:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped.startswith("data_")
    return False


def _parse(text: str, source: str, is_cif: bool):
    import warnings

    from Bio.PDB import MMCIFParser, PDBParser

    parser = MMCIFParser(QUIET=True) if is_cif else PDBParser(QUIET=True, PERMISSIVE=True)
    if not is_cif:
        _check_repeated_residues(text, source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return parser.get_structure("s", io.StringIO(text))
    except Exception as err:  # Biopython raises a variety of types for malformed files
        kind = "mmCIF" if is_cif else "PDB"
        raise InputError(f"{source}: could not parse as {kind}: {type(err).__name__}: {err}") from err


def _check_repeated_residues(text: str, source: str) -> None:
    """Refuse a residue number used twice in a chain (Biopython drops one silently); first model, altlocs ok."""
    seen, last, atoms = set(), None, set()
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("ENDMDL"):
            break
        if not line.startswith("ATOM") or len(line) < 27:
            continue
        key, atom = (line[21], line[22:27]), (line[12:16], line[16])
        if key != last:
            repeat, last, atoms = key in seen, key, set()
            seen.add(key)
        else:
            repeat = atom in atoms
        if repeat:
            raise InputError(f"{source}: residue {key[1].strip()} of chain {key[0]!r} appears twice (line {number}); "
                             "renumber the repeat so no residue is dropped")
        atoms.add(atom)


def _protein_residues(chain) -> list:
    """Amino-acid residues of a Biopython chain: standard records plus MSE; ligands and water skipped."""
    kept = []
    for residue in chain:
        if residue.is_disordered() == 2:  # point mutation: several residue names at one position
            residue.disordered_select(residue.disordered_get_id_list()[0])
            residue = residue.selected_child
        hetflag = residue.id[0]
        name = residue.get_resname().strip().upper()
        if hetflag != " " and name not in MODIFIED_RESIDUE_PARENTS:
            continue
        if any(_atom37_slot(name, atom.get_id()) is not None for atom in residue):
            kept.append(residue)
    return kept


def _choose_chain(residues_by_chain: dict, chain: Optional[str], source: str) -> str:
    available = [cid for cid, res in residues_by_chain.items() if res]
    if chain is None:
        if not available:
            raise InputError(f"{source}: no amino-acid residues found (HETATM-only or empty file)")
        if len(available) > 1:
            logger.info("%s: chains %s, using the first (%r); pick another with chain=", source, available,
                        available[0])
        return available[0]
    if chain not in residues_by_chain:
        raise InputError(f"{source}: no chain {chain!r}; chains with residues: {available}")
    if not residues_by_chain[chain]:
        raise InputError(f"{source}: chain {chain!r} has no amino-acid residues; chains with residues: {available}")
    return chain


def _atom37_slot(resname: str, atom_name: str) -> Optional[int]:
    atom_name = ATOM_RENAMES.get(resname, {}).get(atom_name, atom_name)
    return ATOM37_INDEX.get(atom_name)


def _pick_altloc(atom):
    """Altloc 'A' when present, else the first listed (TMscore reads ' ' or 'A')."""
    if not atom.is_disordered():
        return atom
    ids = atom.disordered_get_id_list()
    return atom.disordered_get("A" if "A" in ids else ids[0])


def _build(residues: list, chain_id: str, source: str) -> Structure:
    length = len(residues)
    coords = np.zeros((length, len(ATOM37_NAMES), 3))
    mask = np.zeros((length, len(ATOM37_NAMES)), dtype=bool)
    numbers, codes, letters = [], [], []
    for i, residue in enumerate(residues):
        name = residue.get_resname().strip().upper()
        _, number, icode = residue.id
        numbers.append(int(number))
        codes.append(icode.strip())
        letters.append(THREE_TO_ONE.get(MODIFIED_RESIDUE_PARENTS.get(name, name), UNKNOWN_RESIDUE))
        for atom in residue:
            slot = _atom37_slot(name, atom.get_id())
            if slot is None:
                continue
            coords[i, slot] = _pick_altloc(atom).get_coord()
            mask[i, slot] = True
    if not mask[:, CA_INDEX].any():
        raise InputError(f"{source}: chain {chain_id!r} has no CA atoms; TM-score, lDDT and contacts need them")
    return Structure(chain_id=chain_id.strip() or chain_id, residue_numbers=np.asarray(numbers, dtype=np.int64),
                     insertion_codes=tuple(codes), sequence="".join(letters),
                     atom37=coords, atom37_mask=mask, source=source)
