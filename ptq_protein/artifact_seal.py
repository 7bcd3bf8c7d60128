"""Integrity of an artifact folder: every number that changes outputs is checked on load.

Why a seal and not a checksum field: the quantizer parameters (activation
scales, zero points, PWLQ codebooks, bits, preset, backend, fp sites) live in
``recipe.json``, readable and diffable. Its whole content except the ``files``
section (the *body*) is written, as canonical JSON, into the metadata header of
``model.safetensors``; the sha256 and size of that tensor file are recorded in
``recipe.json``'s ``files`` section. So:

- an edit of any body field (a scale, a bit width, a deleted key, a NaN, a type
  change) no longer matches the sealed copy, and the message names that field;
- an edit of the tensor file, or of its sealed copy, changes its sha256;
- an edit of ``files`` no longer matches the tensor file.

The report files' sha256 are part of the body, so they are covered too. This is
protection against accidents and naive edits, not a signature: whoever can
rewrite both files can forge an artifact.

Artifacts of format version 1 carry no seal; they are refused with a message
saying to re-quantize (their scales cannot be verified).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from ptq_protein.errors import ArtifactError

__all__ = ["SEAL_KEY", "canonical_json", "first_difference", "recipe_body", "file_sha256",
           "check_files_entry", "check_sealed", "check_recipe_object"]

SEAL_KEY = "recipe"  # safetensors metadata key holding the canonical JSON of the recipe body
FILES = "files"      # the one recipe section outside the seal (it records the sealed tensor file's checksum)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def canonical_json(obj: Any) -> str:
    """One text per JSON value: sorted keys, no spaces (NaN kept as ``NaN`` so it is compared, not lost)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)


def recipe_body(recipe: Mapping[str, Any]) -> Dict[str, Any]:
    """The sealed part of a recipe: everything but ``files``."""
    return {k: v for k, v in recipe.items() if k != FILES}


def first_difference(have: Any, sealed: Any, path: str = "") -> Optional[str]:
    """Path (``a/b/0``) of the first place where ``have`` differs from ``sealed``, or None when equal.

    Leaves are compared by their canonical JSON, so ``8`` vs ``8.0``, ``true`` vs
    ``1`` and ``NaN`` vs a number all differ.
    """
    if isinstance(sealed, dict) and isinstance(have, dict):
        for key in sorted(set(sealed) | set(have)):
            sub = f"{path}/{key}" if path else str(key)
            if key not in have:
                return f"{sub} (missing)"
            if key not in sealed:
                return f"{sub} (not in the sealed copy)"
            found = first_difference(have[key], sealed[key], sub)
            if found:
                return found
        return None
    if isinstance(sealed, list) and isinstance(have, list):
        if len(have) != len(sealed):
            return f"{path or '<top>'} (length {len(have)}, sealed {len(sealed)})"
        for i, (a, b) in enumerate(zip(have, sealed)):
            found = first_difference(a, b, f"{path}/{i}" if path else str(i))
            if found:
                return found
        return None
    return None if canonical_json(have) == canonical_json(sealed) else (path or "<top>")


def check_recipe_object(recipe: Any, where: Path) -> None:
    """A recipe must be a JSON object (a list or a number is refused before any field is read)."""
    if not isinstance(recipe, dict):
        raise ArtifactError(f"{where} must hold a JSON object, not a {type(recipe).__name__}; "
                            "the artifact is corrupt: re-run quantize")


def check_files_entry(recipe: Mapping[str, Any], name: str, where: Path) -> Dict[str, Any]:
    """The ``files/<name>`` entry, checked for shape: ``{"sha256": 64 hex chars, "bytes": int >= 0}``."""
    files = recipe.get(FILES)
    if not isinstance(files, dict):
        raise ArtifactError(f"{where} field {FILES} is missing or not an object; re-run quantize")
    entry = files.get(name)
    if not isinstance(entry, dict):
        raise ArtifactError(f"{where} field {FILES}/{name} is missing or not an object; re-run quantize")
    sha, size = entry.get("sha256"), entry.get("bytes")
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise ArtifactError(f"{where} field {FILES}/{name}/sha256 is not a sha256 hex digest; re-run quantize")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ArtifactError(f"{where} field {FILES}/{name}/bytes is not a byte count; re-run quantize")
    return entry


def check_sealed(recipe: Mapping[str, Any], sealed_text: Optional[str], where: Path, tensors: Path) -> None:
    """Refuse a recipe whose body differs from the copy sealed in the tensor file, naming the first field."""
    if sealed_text is None:
        raise ArtifactError(f"{tensors} carries no sealed recipe, so {where} cannot be verified; re-run quantize")
    try:
        sealed = json.loads(sealed_text)
    except json.JSONDecodeError as err:
        raise ArtifactError(f"the recipe sealed in {tensors} is not valid JSON; re-run quantize") from err
    diff = first_difference(recipe_body(recipe), sealed)
    if diff:
        raise ArtifactError(f"{where} field {diff} does not match the copy sealed in {tensors.name}: the recipe was "
                            "edited or corrupted (quantizer parameters are verified on load); re-run quantize")

