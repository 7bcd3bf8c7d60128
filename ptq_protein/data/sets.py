"""Benchmark sets: the bundled CAMEO/CASP targets, or your own FASTA plus natives.

Set specs (the string the CLI's ``--set`` takes)
-------------------------------------------------
``cameo139``, ``casp14``, ``cameo2022``
    A set bundled in :mod:`ptq_protein.data` (sources and licenses in its manifest).
``NAME:N``
    The first N targets in file order; ``casp14:50`` is the calibration set of
    the PTQ-of-ESMFold study.
``PATH.fasta`` (or ``.fasta.gz``, any extension)
    Your sequences, no natives.
``PATH.fasta:NATIVES_DIR``, optionally ``...:N``
    Your sequences with native structures from ``NATIVES_DIR``.

A trailing all-digit field is always the limit N. Paths containing ``:``
cannot be written in a spec; call ``load_set(path, natives=dir, limit=n)``
(or pass a mapping ``{"fasta": ..., "natives": ..., "limit": ...}``) instead.
A bundled name wins over a file of the same name; write ``./cameo139`` for the file.

Pairing natives with sequences (by id, never by directory order)
------------------------------------------------------------------
A native file is ``<stem>.pdb`` / ``.ent`` / ``.cif`` / ``.mmcif``, optionally
gzipped. For each FASTA id, case-insensitively:

1. the file whose stem equals the id (``7skh.B`` <-> ``7skh.B.pdb``, ``T1024`` <-> ``T1024.pdb``);
2. else, if the id is ``<stem>_<chain>`` (chain = 1-4 letters/digits), the file
   whose stem is ``<stem>`` (``7EQH_A`` <-> ``7EQH.pdb``).

Two files with the same stem are an error; ids without a file get
``native_path=None`` and one logged warning; files no id claims are logged too.

Residue numbering
-----------------
``Target.numbering`` says how to pair native residues with sequence positions:
``"sequence"`` means residue number i is sequence position i (1-based; checked
for every bundled cameo139/casp14 native by ``scripts/bundle_data.py``);
``"author"`` means arbitrary author numbering with gaps: pair by sequence
alignment. User sets default to ``"author"``, which is always safe.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import io
import logging
import os
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ptq_protein import data as bundle
from ptq_protein.data import read_structure_text
from ptq_protein.data.fasta import ESM_AMINO_ACIDS, read_fasta_records, validate_sequence
from ptq_protein.support.errors import ArtifactError, InputError
from ptq_protein.support.io_utils import atomic_write_bytes

__all__ = [
    "BUNDLED_SETS",
    "Numbering",
    "Target",
    "BenchmarkSet",
    "SetSpec",
    "parse_set_spec",
    "load_set",
    "bundled_set_summaries",
    "match_natives",
    "read_structure_text",
]

logger = logging.getLogger(__name__)

BUNDLED_SETS = ("cameo139", "casp14", "cameo2022")
STRUCTURE_SUFFIXES = (".pdb", ".ent", ".cif", ".mmcif")
_CHAIN_SUFFIX = re.compile(r"(.+)_([A-Za-z0-9]{1,4})")
_SHOW_IDS = 5


class Numbering(str, enum.Enum):
    """How native residue numbers relate to sequence positions."""

    SEQUENCE = "sequence"  # residue number i == 1-based sequence position i
    AUTHOR = "author"  # arbitrary numbering with gaps: pair by alignment


@dataclasses.dataclass(frozen=True)
class Target:
    """One sequence to predict, with its native structure if there is one.

    ``native_path`` may be a ``.gz`` file inside the package; read it with
    :meth:`BenchmarkSet.native_text` or :func:`read_structure_text`, or write a
    plain copy with :meth:`BenchmarkSet.extract_native`.
    """

    id: str
    sequence: str = dataclasses.field(repr=False)
    native_path: Optional[Path] = None
    numbering: Numbering = Numbering.AUTHOR
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not self.id or any(ch.isspace() for ch in self.id):
            raise ValueError(f"target id {self.id!r} must be non-empty without whitespace")
        if not self.sequence:
            raise ValueError(f"target {self.id!r} has an empty sequence")
        try:
            object.__setattr__(self, "numbering", Numbering(self.numbering))
        except ValueError as e:
            raise ValueError(f"target {self.id!r}: numbering={self.numbering!r} is not one of "
                             f"{[n.value for n in Numbering]}") from e
        if self.native_path is not None:
            object.__setattr__(self, "native_path", Path(self.native_path))

    @property
    def length(self) -> int:
        return len(self.sequence)


@dataclasses.dataclass(frozen=True)
class BenchmarkSet:
    """An ordered, immutable collection of :class:`Target` (ids unique)."""

    name: str
    targets: Tuple[Target, ...]
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        ids = [t.id for t in self.targets]
        if len(set(ids)) != len(ids):
            repeated = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"set {self.name!r} has repeated target ids {repeated[:_SHOW_IDS]}")

    def __len__(self) -> int:
        return len(self.targets)

    def __iter__(self) -> Iterator[Target]:
        return iter(self.targets)

    @property
    def ids(self) -> List[str]:
        return [t.id for t in self.targets]

    def sequences(self) -> List[str]:
        """Sequences in set order."""
        return [t.sequence for t in self.targets]

    def get(self, target_id: str) -> Target:
        for target in self.targets:
            if target.id == target_id:
                return target
        raise InputError(f"set {self.name!r} has no target {target_id!r}; its ids start {self.ids[:_SHOW_IDS]}")

    def select(self, ids: Sequence[str]) -> "BenchmarkSet":
        """The targets with these ids, in the order given (unknown ids are an error)."""
        return dataclasses.replace(self, targets=tuple(self.get(i) for i in ids))

    def limit(self, n: int) -> "BenchmarkSet":
        """The first ``n`` targets in set order (``casp14`` limited to 50 = the calibration set)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"set limit {n!r} must be a positive integer")
        if n > len(self.targets):
            raise InputError(f"set {self.name!r} has {len(self.targets)} targets, fewer than the {n} asked for; "
                             f"use N <= {len(self.targets)}")
        return dataclasses.replace(self, name=f"{self.name.split(':')[0]}:{n}", targets=self.targets[:n])

    def with_natives(self) -> "BenchmarkSet":
        """Only the targets that have a native structure (the ones that can be scored)."""
        return dataclasses.replace(self, targets=tuple(t for t in self.targets if t.native_path is not None))

    def native_text(self, target: Union[Target, str]) -> str:
        """Text of the target's native structure (bundled files are sha256-checked, ``.gz`` is gunzipped)."""
        return read_structure_text(self._native_path(target))

    def extract_native(self, target: Union[Target, str], dest_dir: Union[str, os.PathLike]) -> Path:
        """Write a plain (uncompressed) copy of the native into ``dest_dir``; return its path."""
        source = self._native_path(target)
        name = source.name[:-3] if source.name.endswith(".gz") else source.name
        dest = Path(dest_dir) / name
        atomic_write_bytes(dest, read_structure_text(source).encode("utf-8"))
        return dest

    def _native_path(self, target: Union[Target, str]) -> Path:
        target = self.get(target) if isinstance(target, str) else target
        if target.native_path is None:
            raise InputError(f"target {target.id!r} of set {self.name!r} has no native structure; "
                             "use BenchmarkSet.with_natives() to keep only scorable targets")
        return target.native_path


@dataclasses.dataclass(frozen=True)
class SetSpec:
    """A parsed set spec: a bundled ``name`` or a ``fasta`` path, optional natives folder and limit."""

    name: Optional[str] = None
    fasta: Optional[Path] = None
    natives: Optional[Path] = None
    limit: Optional[int] = None

    def __post_init__(self) -> None:
        if (self.name is None) == (self.fasta is None):
            raise ValueError("a set spec names exactly one of a bundled set or a FASTA path")
        if self.name is not None and self.name not in BUNDLED_SETS:
            raise InputError(f"unknown bundled set {self.name!r}; choose one of {', '.join(BUNDLED_SETS)}")
        if self.name is not None and self.natives is not None:
            raise InputError(f"bundled set {self.name!r} has its own natives; a natives folder is only for FASTA sets")
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int)
                                       or self.limit < 1):
            raise InputError(f"set limit {self.limit!r} must be a positive integer")


def parse_set_spec(spec: Union[str, os.PathLike, Mapping[str, Any], SetSpec]) -> SetSpec:
    """Parse ``NAME[:N]``, ``FASTA[:NATIVES_DIR][:N]``, a path, or a mapping (see the module docstring)."""
    if isinstance(spec, SetSpec):
        return spec
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"name", "fasta", "natives", "limit"}
        if unknown:
            raise InputError(f"set spec keys {sorted(unknown)} are unknown; use name, fasta, natives, limit")
        return SetSpec(name=spec.get("name"), fasta=_opt_path(spec.get("fasta")),
                       natives=_opt_path(spec.get("natives")), limit=spec.get("limit"))
    if isinstance(spec, os.PathLike):
        return SetSpec(fasta=Path(spec))
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"set spec {spec!r} is empty; give a bundled name ({', '.join(BUNDLED_SETS)}) or a FASTA path")
    parts = spec.strip().split(":")
    limit = None
    if len(parts) > 1 and parts[-1].isdigit():
        limit, parts = int(parts[-1]), parts[:-1]
    if parts[0] in BUNDLED_SETS:
        if len(parts) > 1:
            raise InputError(f"set spec {spec!r}: bundled set {parts[0]!r} has its own natives; "
                             f"write {parts[0]} or {parts[0]}:N")
        return SetSpec(name=parts[0], limit=limit)
    if len(parts) > 2 or not parts[0]:
        raise InputError(f"set spec {spec!r} is not NAME[:N] or FASTA[:NATIVES_DIR][:N]; "
                         "for paths containing ':' call load_set(path, natives=..., limit=...)")
    natives = Path(parts[1]) if len(parts) == 2 and parts[1] else None
    return SetSpec(fasta=Path(parts[0]), natives=natives, limit=limit)


def load_set(spec: Union[str, os.PathLike, Mapping[str, Any], SetSpec], *,
             natives: Optional[Union[str, os.PathLike]] = None, limit: Optional[int] = None,
             numbering: Union[str, Numbering, None] = None, duplicates: str = "error",
             alphabet: str = ESM_AMINO_ACIDS, max_length: Optional[int] = None) -> BenchmarkSet:
    """Load a bundled set or a FASTA (+ natives folder) as a :class:`BenchmarkSet`.

    Parameters
    ----------
    spec
        See the module docstring (``"casp14:50"``, ``"my.fasta:natives/"``, a path or a mapping).
    natives, limit
        Override/complete the spec from Python (natives only for FASTA sets).
    numbering
        For FASTA sets: ``"sequence"`` or ``"author"`` (default; pair by alignment).
    duplicates
        For FASTA sets: ``"error"`` or ``"rename"`` repeated ids (see :func:`~ptq_protein.data.fasta.read_fasta`).
    alphabet, max_length
        Sequence checks, as in :func:`~ptq_protein.data.fasta.validate_sequence`.

    Examples
    --------
    >>> calib = load_set("casp14:50")          # doctest: +SKIP
    >>> evalset = load_set("cameo139").with_natives()   # doctest: +SKIP
    """
    parsed = parse_set_spec(spec)
    updates = {k: v for k, v in (("natives", _opt_path(natives)), ("limit", limit)) if v is not None}
    parsed = dataclasses.replace(parsed, **updates) if updates else parsed
    if parsed.name is not None:
        if numbering is not None:
            raise InputError(f"bundled set {parsed.name!r} has a fixed numbering; numbering= is for FASTA sets")
        result = _load_bundled(parsed.name, alphabet, max_length)
    else:
        result = _load_fasta_set(parsed, Numbering(numbering or Numbering.AUTHOR), duplicates, alphabet, max_length)
    return result.limit(parsed.limit) if parsed.limit is not None else result


def bundled_set_summaries() -> List[Dict[str, Any]]:
    """One dict per bundled set (name, targets, natives, numbering, description, source, license), from the manifest."""
    sets = bundle.load_manifest()["sets"]
    return [{"name": name, "targets": len(sets[name]["ids"]), "natives": len(sets[name]["natives"]),
             **{k: sets[name][k] for k in ("numbering", "description", "source", "license")}} for name in BUNDLED_SETS]


def match_natives(ids: Sequence[str], natives_dir: Union[str, os.PathLike]) -> Dict[str, Optional[Path]]:
    """Pair each id with its native file in ``natives_dir`` by the id rule (module docstring).

    Returns ``{id: path or None}``; two files with the same stem raise :class:`InputError`.
    """
    folder = Path(natives_dir)
    if not folder.is_dir():
        raise InputError(f"natives folder {folder} does not exist or is not a folder; check the path")
    by_stem: Dict[str, List[Path]] = {}
    for path in sorted(folder.iterdir()):
        stem = _structure_stem(path.name)
        if stem is not None and path.is_file():
            by_stem.setdefault(stem.lower(), []).append(path)
    matched: Dict[str, Optional[Path]] = {}
    for target_id in ids:
        candidates = by_stem.get(target_id.lower())
        chain = _CHAIN_SUFFIX.fullmatch(target_id)
        if candidates is None and chain:
            candidates = by_stem.get(chain.group(1).lower())
        if candidates and len(candidates) > 1:
            raise InputError(f"natives folder {folder}: id {target_id!r} matches several files "
                             f"{[p.name for p in candidates]}; keep one")
        matched[target_id] = candidates[0] if candidates else None
    _log_pairing(matched, by_stem, folder)
    return matched


# --- loaders -------------------------------------------------------------------


def _load_bundled(name: str, alphabet: str, max_length: Optional[int]) -> BenchmarkSet:
    entry = bundle.load_manifest()["sets"][name]
    text = bundle.read_bundled_bytes(entry["sequences_file"]).decode("utf-8")
    where = f"bundled {entry['sequences_file']}"
    if entry["format"] == "fasta":
        records = [(r.id, r.sequence, {"description": r.description} if r.description else {})
                   for r in read_fasta_records(text, alphabet=alphabet, max_length=max_length,
                                               duplicates=entry["duplicates"], where=where)]
    else:
        records = _read_targets_csv(text, entry, alphabet, max_length, where)
    ids = [r[0] for r in records]
    if ids != entry["ids"]:
        raise ArtifactError(f"{where}: its ids differ from the manifest; reinstall ptq-protein "
                            "or rebuild the bundle with scripts/bundle_data.py")
    extras = entry.get("extra_files", {})
    targets = []
    for target_id, sequence, meta in records:
        meta = dict(meta)
        for kind, files in extras.items():
            if target_id in files:
                meta[kind] = bundle.bundled_path(files[target_id])
        native = entry["natives"].get(target_id)
        targets.append(Target(target_id, sequence, bundle.bundled_path(native) if native else None,
                              entry["numbering"], meta))
    info = {k: entry[k] for k in ("description", "source", "license")}
    return BenchmarkSet(name, tuple(targets), info)


def _read_targets_csv(text: str, entry: Mapping[str, Any], alphabet: str, max_length: Optional[int],
                      where: str) -> List[Tuple[str, str, Dict[str, Any]]]:
    """Rows of a cameo2022-style CSV: id from ``name`` (minus ``.pdb``), sequence from ``seqres``."""
    id_column, seq_column = entry["id_column"], entry["sequence_column"]
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        target_id = _structure_stem(row[id_column]) or row[id_column]
        sequence = validate_sequence(row[seq_column], alphabet=alphabet, max_length=max_length,
                                     where=f"{where}: sequence {target_id!r}")
        meta = {entry["column_renames"].get(k, k): v for k, v in row.items() if k not in (id_column, seq_column)}
        rows.append((target_id, sequence, meta))
    return rows


def _load_fasta_set(spec: SetSpec, numbering: Numbering, duplicates: str, alphabet: str,
                    max_length: Optional[int]) -> BenchmarkSet:
    if not spec.fasta.is_file():
        raise InputError(f"set {str(spec.fasta)!r} is neither a bundled set ({', '.join(BUNDLED_SETS)}) "
                         "nor an existing FASTA file; check the name or path")
    records = read_fasta_records(spec.fasta, alphabet=alphabet, max_length=max_length, duplicates=duplicates)
    natives = match_natives([r.id for r in records], spec.natives) if spec.natives is not None else {}
    targets = tuple(Target(r.id, r.sequence, natives.get(r.id), numbering,
                           {"description": r.description} if r.description else {}) for r in records)
    name = spec.fasta.name.split(".")[0] or str(spec.fasta)
    info = {"source": str(spec.fasta), "natives": str(spec.natives) if spec.natives else None}
    return BenchmarkSet(name, targets, info)


def _structure_stem(filename: str) -> Optional[str]:
    """``"7skh.B.pdb.gz"`` -> ``"7skh.B"``; None when the name is not a structure file."""
    base = filename[:-3] if filename.lower().endswith(".gz") else filename
    for suffix in STRUCTURE_SUFFIXES:
        if base.lower().endswith(suffix) and len(base) > len(suffix):
            return base[:-len(suffix)]
    return None


def _log_pairing(matched: Mapping[str, Optional[Path]], by_stem: Mapping[str, List[Path]], folder: Path) -> None:
    missing = [i for i, p in matched.items() if p is None]
    if missing:
        logger.warning("%d of %d targets have no native in %s (e.g. %s); they can be predicted but not scored",
                       len(missing), len(matched), folder, ", ".join(missing[:_SHOW_IDS]))
    used = {p for p in matched.values() if p is not None}
    unused = sorted(p.name for paths in by_stem.values() for p in paths if p not in used)
    if unused:
        logger.warning("%d native files in %s match no FASTA id (e.g. %s)", len(unused), folder,
                       ", ".join(unused[:_SHOW_IDS]))
    shared = sorted({p.name for p in used if sum(q == p for q in matched.values()) > 1})
    if shared:
        logger.warning("native files %s are shared by several ids (PDBID_chain fallback); check they hold "
                       "one chain each", shared[:_SHOW_IDS])


def _opt_path(value: Optional[Union[str, os.PathLike]]) -> Optional[Path]:
    return None if value is None else Path(value)
