"""Benchmark data shipped inside the package, and integrity-checked reads of it.

The folder holds gzip-compressed copies of the CAMEO/CASP sets (see
``manifest.json`` for their sources and licenses) written by
``scripts/bundle_data.py``. Nothing here reads outside the package at run time.

Each file's sha256 is recorded in the manifest; :func:`read_bundled_bytes`
checks it the first time a file is read in a process (and again if the file's
size or mtime changes), so a truncated or edited install fails loudly with an
:class:`~ptq_protein.support.errors.ArtifactError` instead of giving wrong scores.
:func:`read_structure_text` reads any structure file, bundled (checked) or not.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from ptq_protein.support.errors import ArtifactError, InputError
from ptq_protein.support.file_reads import gunzip

__all__ = [
    "DATA_DIR",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "load_manifest",
    "bundled_path",
    "bundled_relpath",
    "read_bundled_bytes",
    "verify_bundled_file",
    "sha256_bytes",
    "read_structure_text",
]

DATA_DIR = Path(__file__).resolve().parent
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
_REBUILD_HINT = "reinstall ptq-protein or rebuild the bundle with scripts/bundle_data.py"

_verified: Dict[str, Tuple[int, int]] = {}
_verified_lock = threading.Lock()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=1)
def load_manifest() -> Dict[str, Any]:
    """The parsed ``manifest.json`` (cached; treat it as read-only)."""
    path = DATA_DIR / MANIFEST_NAME
    if not path.is_file():
        raise ArtifactError(f"bundled data manifest {path} is missing; {_REBUILD_HINT}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"bundled data manifest {path} is not valid JSON ({e}); {_REBUILD_HINT}") from e
    if manifest.get("format_version") != MANIFEST_VERSION:
        raise ArtifactError(f"bundled data manifest {path} has format_version {manifest.get('format_version')!r}, "
                            f"this code reads {MANIFEST_VERSION}; {_REBUILD_HINT}")
    return manifest


def bundled_path(relpath: str) -> Path:
    """Absolute path of a bundled file given its manifest name (``"cameo139/native/7ACY.pdb.gz"``)."""
    if relpath not in load_manifest()["files"]:
        raise ArtifactError(f"{relpath!r} is not a file of the bundled data manifest")
    return DATA_DIR / relpath


def bundled_relpath(path: Union[str, Path]) -> Optional[str]:
    """The manifest name of ``path`` if it is a bundled file, else None."""
    try:
        rel = Path(path).resolve().relative_to(DATA_DIR).as_posix()
    except ValueError:
        return None
    return rel if rel in load_manifest()["files"] else None


def verify_bundled_file(relpath: str) -> bytes:
    """Read a bundled file's raw bytes and check them against the manifest sha256.

    Raises
    ------
    ArtifactError
        The file is missing, or its size or sha256 differs from the manifest.
    """
    entry = load_manifest()["files"].get(relpath)
    if entry is None:
        raise ArtifactError(f"{relpath!r} is not a file of the bundled data manifest")
    path = DATA_DIR / relpath
    try:
        data = path.read_bytes()
        stat = path.stat()
    except FileNotFoundError as e:
        raise ArtifactError(f"bundled file {path} is missing; {_REBUILD_HINT}") from e
    stamp = (stat.st_size, stat.st_mtime_ns)
    with _verified_lock:
        if _verified.get(relpath) == stamp:
            return data
    digest = sha256_bytes(data)
    if len(data) != entry["bytes"] or digest != entry["sha256"]:
        raise ArtifactError(f"bundled file {path} is corrupt: sha256 {digest[:12]}... ({len(data)} bytes) "
                            f"but the manifest has {entry['sha256'][:12]}... ({entry['bytes']} bytes); {_REBUILD_HINT}")
    with _verified_lock:
        _verified[relpath] = stamp
    return data


def read_bundled_bytes(relpath: str, decompress: bool = True) -> bytes:
    """Verified contents of a bundled file, gunzipped when it ends in ``.gz`` and ``decompress``."""
    data = verify_bundled_file(relpath)
    if decompress and relpath.endswith(".gz"):
        return gunzip(data, f"bundled file {DATA_DIR / relpath}", _REBUILD_HINT, error=ArtifactError)
    return data


def read_structure_text(path: Union[str, os.PathLike]) -> str:
    """Text of a structure file; bundled files are sha256-checked, ``.gz`` files are gunzipped."""
    path = Path(path)
    rel = bundled_relpath(path)
    if rel is not None:
        raw = read_bundled_bytes(rel)
    else:
        try:
            raw = path.read_bytes()
        except FileNotFoundError as e:
            raise InputError(f"structure file {path} not found; check the natives folder") from e
        if raw[:2] == b"\x1f\x8b":
            raw = gunzip(raw, f"structure file {path}", "re-download it")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"structure file {path} is not text (byte {e.start}); give a PDB or mmCIF file") from e
