"""Calibration sequences from what the caller gave: a FASTA path, a bundled set spec, or a list."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

from ptq_protein.support.errors import InputError

__all__ = ["CalibrationArg", "resolve_calibration", "calibration_records", "calibration_sequences", "crop_sequence",
           "input_files", "input_digests", "with_input_digests"]

CalibrationArg = Union[None, str, Path, Sequence[str], Sequence[tuple]]


def resolve_calibration(calibration: CalibrationArg, why: str = "static activations") -> tuple:
    """(name, sequences) from a FASTA path, a set spec (``casp14:50``), or a list."""
    return _calibration_name(calibration), [seq for _, seq in calibration_records(calibration, why)]


def calibration_records(calibration: CalibrationArg, why: str = "static activations") -> List[tuple]:
    """(id, sequence) pairs of a FASTA path, a set spec or a list (list items get ids ``seq1``, ...)."""
    if calibration is None:
        raise InputError(f"this recipe has {why} and needs calibration sequences: pass calibration= "
                         "(a FASTA path, a bundled set such as 'casp14:50', or a list of sequences)")
    if isinstance(calibration, (str, Path)):
        text = str(calibration)
        if Path(text).exists():
            from ptq_protein.data.fasta import read_fasta

            return list(read_fasta(Path(text), duplicates="rename"))  # calibration reads no ids
        from ptq_protein.data.sets import load_set

        bench = load_set(text)
        return [(t.id, t.sequence) for t in bench]
    records = [item if isinstance(item, tuple) else (f"seq{i + 1}", item) for i, item in enumerate(calibration)]
    if not all(isinstance(s, str) for _, s in records):
        raise TypeError("calibration must be a FASTA path, a set name, or a list of sequence strings "
                        "/ (id, seq) tuples")
    return records


def calibration_sequences(adapter, calibration: CalibrationArg, calib_max_length: Optional[int],
                          why: str = "static activations") -> tuple:
    """(name, sequences) as calibration runs them: validated, and cropped to ``calib_max_length``."""
    name, seqs = resolve_calibration(calibration, why)
    return name, [crop_sequence(s, calib_max_length) for s in adapter.validate(seqs, where="calibration")]


def crop_sequence(seq: str, max_length: Optional[int]) -> str:
    """The central ``max_length`` residues of ``seq`` (all of it when shorter, or when ``max_length`` is None/0)."""
    if not max_length or len(seq) <= max_length:
        return seq
    start = (len(seq) - max_length) // 2
    return seq[start:start + max_length]


def input_files(source: CalibrationArg) -> List[Path]:
    """The files a FASTA path or set spec reads (the FASTA, a natives folder); none for a bundled set or a list."""
    if not isinstance(source, (str, Path)):
        return []
    if Path(str(source)).exists():
        return [Path(str(source))]
    from ptq_protein.data.sets import parse_set_spec

    spec = parse_set_spec(str(source))
    return [p for p in (spec.fasta, spec.natives) if p is not None and p.exists()]


def input_digests(named: Mapping[str, CalibrationArg]) -> Dict[str, str]:
    """``{"calibration calib.fa": sha256, ...}``: the content of every file each named argument reads.

    A resumed run records these in its ``run.json`` and refuses to go on when one differs
    (a FASTA rewritten in place, same path and count, would otherwise mix two runs' rows).
    Bundled sets and lists read no file: ``{}``, which a run records as nothing (see :func:`with_input_digests`).
    """
    from ptq_protein.support.digests import path_sha256

    return {f"{label} {path}": path_sha256(path) for label, source in named.items() for path in input_files(source)}


def with_input_digests(info: Mapping, named: Mapping[str, CalibrationArg], key: str = "inputs") -> Dict:
    """``info`` plus ``{key: input_digests(named)}`` when any file is read (runs on bundled sets stay as they were)."""
    digests = input_digests(named)
    return {**info, key: digests} if digests else dict(info)


def _calibration_name(calibration: CalibrationArg) -> str:
    if isinstance(calibration, (str, Path)):
        return Path(str(calibration)).name if Path(str(calibration)).exists() else str(calibration)
    return "sequences"
