#!/usr/bin/env python
"""Rebuild ``ptq_protein/data/`` (gzipped benchmark sets + manifest.json) from a source folder.

Usage::

    python scripts/bundle_data.py --source /path/to/data   # e.g. the steering repo's shared/data folder
    python scripts/bundle_data.py --source DIR --dest ptq_protein/data
    python scripts/bundle_data.py --check              # rebuild in memory, report differences, write nothing

The output is byte-for-byte reproducible: gzip members carry no file name and
mtime 0, files are listed in sorted order, the manifest is sorted JSON.
Natives are paired with sequences by id (``ptq_protein.data.sets.match_natives``),
and for sets declared ``numbering="sequence"`` every native residue number is
checked against the FASTA letter at that position; a mismatch stops the build.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import logging
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ptq_protein.data import MANIFEST_NAME, MANIFEST_VERSION, sha256_bytes  # noqa: E402
from ptq_protein.data.fasta import read_fasta_records  # noqa: E402
from ptq_protein.data.sets import BUNDLED_SETS, match_natives  # noqa: E402
from ptq_protein.support.io_utils import atomic_dir, atomic_write_text  # noqa: E402

_GZIP_LEVEL = 9
_FILE_MODE, _DIR_MODE = 0o644, 0o755
_STUDY = ("PTQ4Protein, the code of 'Exploring Post-Training Quantization of Protein Language Models' "
          "(github.com/pengshuang/PTQ4Protein, structure_prediction/data)")
_PDB_NOTE = "experimentally determined PDB chains; PDB coordinate data is public domain"

# One entry per bundled set: where its files are and what is known about them.
SETS: Dict[str, Dict[str, Any]] = {
    "cameo139": {
        "sequences": "sequences.fasta", "format": "fasta", "duplicates": "error", "numbering": "sequence",
        "description": "139 CAMEO targets: the evaluation set of the PTQ-of-ESMFold study",
        "source": _STUDY, "license": _PDB_NOTE,
    },
    "casp14": {
        "sequences": "sequences.fasta", "format": "fasta", "duplicates": "rename", "numbering": "sequence",
        "description": ("173 CASP14 target/domain sequences (34 natives); the first 50 in file order are the "
                        "study's calibration set (casp14:50). Repeated FASTA ids (hetero-complex subunits, "
                        "one exact repeat) are renamed <id>#2, <id>#3, ..."),
        "source": _STUDY, "license": _PDB_NOTE,
    },
    "cameo2022": {
        "sequences": "targets.csv", "format": "csv", "numbering": "author",
        "id_column": "name", "sequence_column": "seqres", "column_renames": {"seq": "observed_sequence"},
        "samples": ("eigenfold_samples", ".pdb.0.pdb", "eigenfold_sample"),
        "license_file": "LICENSE.EigenFold",
        "description": ("183 CAMEO targets released 2022-08-03..2022-10-26; sequence = seqres (full sequence); "
                        "natives are author-numbered; 40 published EigenFold CA-only predictions (sample 0, "
                        "numbered 1..len(seqres)) are in metadata['eigenfold_sample']"),
        "source": "EigenFold (github.com/bjing2016/EigenFold, splits/cameo2022.csv and structures/)",
        "license": "MIT (see cameo2022/LICENSE.EigenFold); natives: " + _PDB_NOTE,
    },
}

_COPIED_KEYS = ("format", "duplicates", "numbering", "description", "source", "license",
                "id_column", "sequence_column", "column_renames")


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True,
                        help="folder with cameo139/, casp14/, cameo2022/ (the data the bundle is rebuilt from)")
    parser.add_argument("--dest", type=Path, default=REPO / "ptq_protein" / "data",
                        help="package data folder to (re)write (default: ptq_protein/data)")
    parser.add_argument("--check", action="store_true", help="only compare with the existing bundle")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    files, manifest = build(args.source)
    if args.check:
        return check(args.dest, files, manifest)
    write(args.dest, files, manifest)
    total = sum(len(b) for b in files.values())
    logging.info("wrote %d files, %.1f MB, to %s", len(files), total / 1e6, args.dest)
    return 0


def build(source: Path) -> Tuple[Dict[str, bytes], Dict[str, Any]]:
    """Return ({relative path: bytes}, manifest dict) for every set in :data:`SETS`."""
    assert tuple(SETS) == BUNDLED_SETS, "SETS and ptq_protein.data.sets.BUNDLED_SETS must list the same sets"
    files: Dict[str, bytes] = {}
    provenance: Dict[str, Tuple[str, bytes]] = {}
    sets = {}
    for name, spec in SETS.items():
        folder = source / name
        ids, sequences = _read_sequences(folder / spec["sequences"], spec)
        entry = {k: spec[k] for k in _COPIED_KEYS if k in spec}
        entry.update(ids=ids, lengths=[len(s) for s in sequences],
                     sequences_file=_add(files, provenance, source, folder / spec["sequences"], name))
        pairs = match_natives(ids, folder / "native")
        if spec["numbering"] == "sequence":
            _check_sequence_numbering(pairs, dict(zip(ids, sequences)))
        entry["natives"] = {i: _add(files, provenance, source, p, f"{name}/native") for i, p in pairs.items() if p}
        used = set(pairs.values())
        entry["unpaired_natives"] = [_add(files, provenance, source, p, f"{name}/native")
                                     for p in sorted((folder / "native").iterdir()) if p not in used]
        if "samples" in spec:
            sub, suffix, kind = spec["samples"]
            entry["extra_files"] = {kind: {i: _add(files, provenance, source, folder / sub / f"{i}{suffix}",
                                                   f"{name}/{sub}")
                                           for i in ids if (folder / sub / f"{i}{suffix}").is_file()}}
        if "license_file" in spec:
            entry["license_file"] = _add(files, provenance, source, folder / spec["license_file"], name,
                                         compress=False)
        sets[name] = entry
    manifest = {
        "format_version": MANIFEST_VERSION,
        "generated_by": "scripts/bundle_data.py",
        "sets": sets,
        "files": {rel: {"sha256": sha256_bytes(data), "bytes": len(data), "source": provenance[rel][0],
                        "source_sha256": sha256_bytes(provenance[rel][1])} for rel, data in sorted(files.items())},
    }
    return files, manifest


def write(dest: Path, files: Dict[str, bytes], manifest: Dict[str, Any]) -> None:
    """Replace each set folder under ``dest`` atomically, then the manifest."""
    for name in SETS:
        with atomic_dir(dest / name, force=True) as tmp:
            for rel, data in files.items():
                if rel.startswith(f"{name}/"):
                    path = tmp / rel[len(name) + 1:]
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
            _make_readable(tmp)
    atomic_write_text(dest / MANIFEST_NAME, _manifest_text(manifest))
    (dest / MANIFEST_NAME).chmod(_FILE_MODE)


def check(dest: Path, files: Dict[str, bytes], manifest: Dict[str, Any]) -> int:
    """0 when ``dest`` holds exactly ``files`` and ``manifest``, else 1 (differences logged)."""
    problems = [rel for rel, data in files.items()
                if not (dest / rel).is_file() or (dest / rel).read_bytes() != data]
    manifest_path = dest / MANIFEST_NAME
    if not manifest_path.is_file() or manifest_path.read_text(encoding="utf-8") != _manifest_text(manifest):
        problems.append(MANIFEST_NAME)
    for rel in problems[:20]:
        logging.error("differs or missing: %s", rel)
    logging.info("bundle %s: %d of %d files differ", dest, len(problems), len(files) + 1)
    return 1 if problems else 0


# --- helpers -------------------------------------------------------------------


def _read_sequences(path: Path, spec: Dict[str, Any]) -> Tuple[List[str], List[str]]:
    if spec["format"] == "fasta":
        records = read_fasta_records(path, duplicates=spec["duplicates"])
        return [r.id for r in records], [r.sequence for r in records]
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    ids = [r[spec["id_column"]][:-len(".pdb")] for r in rows]
    return ids, [r[spec["sequence_column"]] for r in rows]


def _add(files: Dict[str, bytes], provenance: Dict[str, Tuple[str, bytes]], source: Path, path: Path,
         folder: str, compress: bool = True) -> str:
    """Register ``path`` (gzipped unless ``compress`` is False) under ``folder``; return its bundle name."""
    raw = path.read_bytes()
    rel = f"{folder}/{path.name}.gz" if compress else f"{folder}/{path.name}"
    files[rel] = _gzip(raw) if compress else raw
    provenance[rel] = (path.relative_to(source).as_posix(), raw)
    return rel


def _gzip(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=_GZIP_LEVEL, mtime=0) as handle:
        handle.write(data)
    return buffer.getvalue()


def _check_sequence_numbering(pairs: Dict[str, Path], sequences: Dict[str, str]) -> None:
    """Every CA residue number i of each native must carry the FASTA letter at position i."""
    from Bio.Data.PDBData import protein_letters_3to1_extended as three_to_one

    for target_id, path in pairs.items():
        if path is None:
            continue
        sequence = sequences[target_id]
        for line in path.read_text().splitlines():
            if line.startswith("ENDMDL"):
                break
            if not line.startswith(("ATOM", "HETATM")) or line[12:16].strip() != "CA":
                continue
            number, letter = line[22:27].strip(), three_to_one.get(line[17:20].strip().upper(), "X")
            if not number.isdigit() or not 1 <= int(number) <= len(sequence) or sequence[int(number) - 1] != letter:
                raise SystemExit(f"{path}: residue {number} {line[17:20]} does not match {target_id!r} at that "
                                 "position; declare this set numbering='author'")


def _make_readable(folder: Path) -> None:
    """Temp folders/files are created private (0700/0600); package data must be world-readable."""
    folder.chmod(_DIR_MODE)
    for path in folder.rglob("*"):
        path.chmod(_DIR_MODE if path.is_dir() else _FILE_MODE)


def _manifest_text(manifest: Dict[str, Any]) -> str:
    return json.dumps(manifest, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.exit(main())
