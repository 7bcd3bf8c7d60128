"""Read, check and write protein FASTA files.

Every error is an :class:`~ptq_protein.support.errors.InputError` with a one-line message
that names the file, the record, what is wrong and how to fix it, because the
CLI prints exactly that line.

Rules, in the order they are applied to each record:

* lines end at ``\\n``, ``\\r\\n`` or ``\\r`` only (Python's universal newlines, as fair-esm and Biopython
  read files): NEL, LINE SEPARATOR or a form feed inside a header are part of the header;
* the header is the line after ``>``, stripped at both ends (fair-esm's label); the id is its first
  whitespace-separated word, the rest the description; lines starting with ``;`` are comments;
* ASCII whitespace inside sequence lines is dropped, ASCII letters are upper-cased; any other
  character is an invalid letter;
* one terminal ``*`` (stop codon) is stripped; a ``*`` anywhere else is invalid;
* letters outside ``alphabet`` are an error naming the id, letter and position;
* a sequence longer than ``max_length`` is an error naming the limit.

Example
-------
>>> read_fasta(">a desc\\nmkt*\\n>b\\nAC GT\\n")
[('a', 'MKT'), ('b', 'ACGT')]
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from ptq_protein.support.errors import InputError
from ptq_protein.support.file_reads import gunzip
from ptq_protein.support.io_utils import atomic_write_text

__all__ = [
    "STANDARD_AMINO_ACIDS",
    "ESM_AMINO_ACIDS",
    "ESM2_MAX_RESIDUES",
    "FastaRecord",
    "read_fasta",
    "read_fasta_records",
    "validate_sequence",
    "cleaning_note",
    "write_fasta",
]

#: The 20 standard amino acids (IUPAC one-letter codes).
STANDARD_AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
#: Residue letters in the ESM vocabulary (``esm.constants.proteinseq_toks`` minus ``.`` and ``-``):
#: the standard 20 plus X (unknown), B, U, Z, O.
ESM_AMINO_ACIDS = STANDARD_AMINO_ACIDS + "XBUZO"
#: ESM-2 has 1024 positions; two are taken by the BOS and EOS tokens (fair-esm ESM-2 paper).
ESM2_MAX_RESIDUES = 1022

#: Letters ESM's own tokenizers read (ESM C's encodes each), and why they are refused here.
_LETTER_HINTS = {
    "-": " (an alignment gap: sequences are read unaligned, though ESM's own tokenizers encode it, id 30)",
    ".": " (an alignment gap: sequences are read unaligned, though ESM's own tokenizers encode it, id 29)",
    "_": " (a masked position in EvolutionaryScale's package, its <mask>: residues only are read here)",
    "|": " (ESM C's chain break: one chain per sequence is read here)",
}
_DUPLICATE_POLICIES = ("error", "rename")
_ASCII_SPACE = " \t\n\r\v\f"
_LINE_END = re.compile(r"\r\n|\r|\n")
_MAX_SNIPPET = 40

PathOrText = Union[str, bytes, os.PathLike]


class FastaRecord(NamedTuple):
    """One FASTA entry: ``id`` (first header word), upper-case ``sequence``, the rest of the header, and the
    whole header as written (stripped at both ends: fair-esm's label, tabs and repeated spaces kept)."""

    id: str
    sequence: str
    description: str = ""
    header: str = ""


def read_fasta(source: PathOrText, *, alphabet: str = ESM_AMINO_ACIDS, max_length: Optional[int] = None,
               duplicates: str = "error", where: Optional[str] = None,
               changes: Optional[Dict[str, str]] = None) -> List[Tuple[str, str]]:
    """Parse FASTA into ``[(id, sequence), ...]`` in file order.

    Parameters
    ----------
    source
        A path (``.gz`` is read transparently), or FASTA text (a ``str`` that
        starts with ``>`` or contains a newline, or ``bytes``).
    alphabet
        Allowed residue letters (upper case); default the ESM vocabulary.
    max_length
        Longest allowed sequence, or None for no limit.
    duplicates
        ``"error"`` (default) rejects a repeated id; ``"rename"`` keeps the first
        and names the k-th repeat ``<id>#k`` (k = 2, 3, ...).
    where
        Name used in messages (default: the path, or ``"FASTA text"``).
    changes
        If given, filled with id -> what reading changed in that sequence (lower case read as
        upper case, a terminal ``*`` dropped), for sequences it changed.

    Returns
    -------
    list of (str, str)
    """
    records = read_fasta_records(source, alphabet=alphabet, max_length=max_length,
                                 duplicates=duplicates, where=where, changes=changes)
    return [(record.id, record.sequence) for record in records]


def read_fasta_records(source: PathOrText, *, alphabet: str = ESM_AMINO_ACIDS,
                       max_length: Optional[int] = None, duplicates: str = "error",
                       where: Optional[str] = None, changes: Optional[Dict[str, str]] = None) -> List[FastaRecord]:
    """Like :func:`read_fasta` but keeps each header's description (:class:`FastaRecord`)."""
    if duplicates not in _DUPLICATE_POLICIES:
        raise ValueError(f"duplicates={duplicates!r} is not one of {_DUPLICATE_POLICIES}")
    text, label = _read_text(source, where)
    raw = _split_records(text, label)
    records, lines, notes = [], [], []
    for header_line, name, description, header, chunks in raw:
        sequence = _clean_sequence("".join(chunks))
        notes.append(cleaning_note("".join(chunks)))
        if not sequence:
            raise InputError(f"{label}: record {name!r} (line {header_line}) has an empty sequence; "
                             "add its residues on the lines after the header or remove the header")
        sequence = validate_sequence(sequence, alphabet=alphabet, max_length=max_length,
                                     where=f"{label}: sequence {name!r}")
        records.append(FastaRecord(name, sequence, description, header))
        lines.append(header_line)
    records = _handle_duplicates(records, duplicates, label, lines)  # same order; repeats renamed
    if changes is not None:
        changes.update({record.id: note for record, note in zip(records, notes) if note})
    return records


def validate_sequence(sequence: str, *, alphabet: str = ESM_AMINO_ACIDS, max_length: Optional[int] = None,
                      where: str = "sequence", limit_reason: Optional[str] = None) -> str:
    """Return ``sequence`` upper-cased, whitespace-free, without a terminal ``*``; raise if it is invalid.

    Parameters
    ----------
    sequence
        Residue letters (any case, whitespace allowed).
    alphabet
        Allowed upper-case letters.
    max_length
        Longest allowed length (e.g. :data:`ESM2_MAX_RESIDUES`), or None.
    where
        What to call the sequence in messages, e.g. ``"my.fasta: sequence 'x'"``.
    limit_reason
        Why ``max_length`` is the limit, for the message (default: ESM-2's 1022 residues).

    Raises
    ------
    InputError
        Empty, containing a letter outside ``alphabet`` (message gives the letter
        and its 1-based position), or longer than ``max_length``.
    """
    if not isinstance(sequence, str):
        raise InputError(f"{where}: expected a string of residue letters, got {type(sequence).__name__}")
    cleaned = _clean_sequence(sequence)
    if not cleaned:
        raise InputError(f"{where}: the sequence is empty; give at least one residue letter")
    allowed = set(alphabet.upper())
    for position, letter in enumerate(cleaned, start=1):
        if letter not in allowed:
            raise InputError(
                f"{where}: invalid letter {letter!r} at position {position}{_LETTER_HINTS.get(letter, '')}; "
                f"allowed letters are {alphabet}; replace it (X stands for an unknown residue) or remove it")
    if max_length is not None and len(cleaned) > max_length:
        raise InputError(
            f"{where}: {len(cleaned)} residues is longer than the limit of {max_length} "
            f"({limit_reason or f'ESM-2 accepts at most {ESM2_MAX_RESIDUES} residues'}); split it into domains or "
            "crop it")
    return cleaned


def write_fasta(path: Union[str, os.PathLike], records: Iterable[Sequence[str]], *, line_width: int = 60) -> Path:
    """Write ``(id, sequence[, description])`` records atomically; return the path.

    Ids must be non-empty and free of whitespace (they are the first header word
    when read back); sequences are written upper-case, ``line_width`` per line.
    """
    if line_width < 1:
        raise ValueError(f"line_width={line_width} must be at least 1")
    lines = []
    for record in records:
        if len(record) not in (2, 3):
            raise ValueError(f"a FASTA record is (id, sequence) or (id, sequence, description), got {record!r}")
        name, sequence = record[0], record[1]
        if not name or any(ch.isspace() for ch in name):
            raise InputError(f"FASTA id {name!r} must be non-empty without whitespace; rename it")
        header = f">{name} {record[2]}".rstrip() if len(record) == 3 else f">{name}"
        lines.append(header)
        sequence = _clean_sequence(sequence)
        lines.extend(sequence[i:i + line_width] for i in range(0, len(sequence), line_width))
    path = Path(path)
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


# --- helpers -----------------------------------------------------------------


def _read_text(source: PathOrText, where: Optional[str]) -> Tuple[str, str]:
    """Return (text, label for messages) for a path, str text or bytes."""
    if isinstance(source, bytes):
        return _decode(source, where or "FASTA bytes"), where or "FASTA bytes"
    if isinstance(source, str) and (source.lstrip().startswith(">") or "\n" in source):
        return source, where or "FASTA text"
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"read_fasta takes a path, FASTA text or bytes, got {type(source).__name__}")
    path = Path(source)
    label = where or str(path)
    if not path.exists():
        raise InputError(f"{label}: FASTA file not found; check the path")
    if path.is_dir() or path.is_char_device() or path.is_block_device():
        kind = "a folder" if path.is_dir() else "a device"
        raise InputError(f"{label} is {kind}, not a FASTA file; give the path of a FASTA file")
    data = path.read_bytes()  # a regular file, or a pipe such as <(zcat seqs.fasta.gz)
    if data[:2] == b"\x1f\x8b":
        data = gunzip(data, label, "re-download or re-compress it")
    return _decode(data, label), label


def _decode(data: bytes, label: str) -> str:
    if b"\x00" in data:
        raise InputError(f"{label}: contains binary data (NUL bytes), not FASTA text; give a plain-text FASTA file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{label}: not UTF-8/ASCII text (byte {e.start}); give a plain-text FASTA file") from e


def _split_records(text: str, label: str) -> List[Tuple[int, str, str, str, List[str]]]:
    """Split into (header line number, id, description, header, sequence lines) without validating letters.

    Lines end at ``\\n``, ``\\r\\n`` and ``\\r`` only: ``str.splitlines`` would also break at NEL, U+2028 and
    form feed, cutting a header in two and embedding its tail as residues.
    """
    records: List[Tuple[int, str, str, str, List[str]]] = []
    for number, line in enumerate(_LINE_END.split(text), start=1):
        stripped = line.strip(_ASCII_SPACE)
        if not stripped or stripped.startswith(";"):
            continue
        if stripped.startswith(">"):
            header = stripped[1:].strip()
            if not header:
                raise InputError(f"{label}: line {number} is a header '>' without an id; write '>ID description'")
            name, *rest = header.split(None, 1)
            records.append((number, name, rest[0].strip() if rest else "", header, []))
        elif not records:
            snippet = stripped[:_MAX_SNIPPET]
            raise InputError(f"{label}: line {number} ({snippet!r}) comes before any '>' header; "
                             "a FASTA file starts with a '>ID' line")
        else:
            records[-1][4].append(stripped)
    if not records:
        raise InputError(f"{label}: no FASTA records found (empty file or no '>' header lines)")
    return records


def _clean_sequence(sequence: str) -> str:
    """ASCII whitespace dropped, ASCII letters upper-cased; other characters kept for validation to name
    (``str.upper`` would turn ``ß`` into ``SS``, ``str.split`` drop NEL)."""
    kept = "".join(ch.upper() if ch.isascii() else ch for ch in sequence if ch not in _ASCII_SPACE)
    return kept[:-1] if kept.endswith("*") else kept


def cleaning_note(raw: str) -> str:
    """What :func:`_clean_sequence` changes in ``raw``, in words ("" for nothing worth saying)."""
    said = []
    lower = sum(1 for ch in raw if ch.islower() and ch.isascii())
    if lower:
        said.append(f"{lower} lower-case letter{'s' if lower > 1 else ''} read as upper case")
    if raw.strip(_ASCII_SPACE).endswith("*"):
        said.append("the terminal '*' (stop) dropped")
    return "; ".join(said)


def _handle_duplicates(records: List[FastaRecord], policy: str, label: str,
                       lines: Sequence[int]) -> List[FastaRecord]:
    seen: dict = {}
    first_line: dict = {}
    out = []
    for record, line in zip(records, lines):
        count = seen.get(record.id, 0) + 1
        seen[record.id] = count
        first_line.setdefault(record.id, line)
        if count == 1:
            out.append(record)
        elif policy == "error":
            raise InputError(f"{label}: id {record.id!r} appears more than once (headers on lines "
                             f"{first_line[record.id]} and {line}); ids must be unique "
                             "(rename the repeats, or have them named <id>#2, <id>#3, ...: --duplicates rename for "
                             "embed, fold and eval; duplicates='rename' in Python)")
        else:
            renamed_id = f"{record.id}#{count}"
            out.append(record._replace(id=renamed_id, header=renamed_id + record.header[len(record.id):]))
    renamed = {record.id for record in out}
    if len(renamed) != len(out):
        raise InputError(f"{label}: renaming repeated ids clashes with an existing '<id>#k' id; rename them by hand")
    return out
