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
- an edit of ``files`` no longer matches the tensor file;
- an edit of any tensor (a weight code, a scale) no longer matches the digest of
  every tensor's name, dtype, shape and bytes (``tensors_sha256``), which is part
  of the sealed body: rewriting ``files`` to match an edited tensor file is not enough.

Only plain files inside the folder are read (:func:`plain_file`): a link (to
``/dev/zero``, to another artifact's file) or a FIFO is refused before it is opened.

The report files' and the copied tokenizer files' sha256 are part of the body, so they are covered too;
``README.md`` and ``config.json`` are not (no output depends on them, and Hub cards get edited). This is
protection against accidents and naive edits, not a signature: whoever can
rewrite both files can forge an artifact.

Artifacts of format version 1 carry no seal; they are refused with a message
saying to re-quantize (their scales cannot be verified).
"""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

from ptq_protein.support.digests import file_sha256
from ptq_protein.support.errors import ArtifactError

__all__ = ["TENSORS", "RECIPE", "REPORT_JSON", "REPORT_MD", "DTYPES",
           "SEAL_KEY", "TENSORS_DIGEST", "canonical_json", "first_difference", "recipe_body", "file_sha256",
           "tensors_sha256", "check_tensors", "plain_file", "check_files_entry", "check_sealed", "check_recipe_object"]

TENSORS, RECIPE, REPORT_JSON, REPORT_MD = "model.safetensors", "recipe.json", "report.json", "report.md"
DTYPES = "dtypes"  # recipe field: the floating dtype the model runs in (see models/float_dtypes)
SEAL_KEY = "recipe"  # safetensors metadata key holding the canonical JSON of the recipe body
FILES = "files"      # the one recipe section outside the seal (it records the sealed tensor file's checksum)
TENSORS_DIGEST = "tensors_sha256"  # sealed recipe field: digest of the tensors themselves (see tensors_sha256)


def plain_file(folder: Path, name: str) -> Path:
    """``folder / name`` if it is a regular file (not a link, FIFO or device); else an ArtifactError.

    ``name`` must be a plain file name: a recipe cannot point the loader outside its folder.
    """
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ArtifactError(f"{folder} names the file {name!r}, which is not a plain file name inside the artifact "
                            "folder; the artifact is corrupt: re-run quantize")
    path = folder / name
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError as err:
        raise ArtifactError(f"{path} is missing; the artifact is incomplete: re-run quantize") from err
    if stat.S_ISLNK(mode) or not stat.S_ISREG(mode):
        what = "a link" if stat.S_ISLNK(mode) else "not a regular file"
        raise ArtifactError(f"{path} is {what}; an artifact is read only from regular files inside its folder: "
                            "copy the real file there, or re-run quantize")
    return path


def tensors_sha256(tensors: Mapping[str, Any], after: Optional[Callable[[Any], Any]] = None) -> str:
    """sha256 over every tensor's name, dtype, shape and raw bytes, in name order (independent of file layout).

    ``after(tensor)`` runs once each tensor is hashed (a mapped file hands its pages back there).
    """
    import torch

    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}\0{str(tensor.dtype)}\0{tuple(tensor.shape)}\0".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # its buffer: no copy of the bytes
        if after is not None:
            after(tensors[name])
    return digest.hexdigest()


def check_tensors(recipe: Mapping[str, Any], tensors: Mapping[str, Any], where: Path, file: Path,
                  after: Optional[Callable[[Any], Any]] = None) -> None:
    """Refuse tensors whose digest differs from the sealed ``tensors_sha256`` (an edited code or scale);
    ``after``: as :func:`tensors_sha256`'s."""
    expected = recipe.get(TENSORS_DIGEST)
    if not isinstance(expected, str):
        raise ArtifactError(f"{where} has no field {TENSORS_DIGEST}, so the tensors in {file.name} cannot be "
                            "verified; re-run quantize")
    if tensors_sha256(tensors, after) != expected:
        raise ArtifactError(f"{file} holds tensors that differ from the digest sealed in {where.name} (field "
                            f"{TENSORS_DIGEST}): a weight code or scale was edited or corrupted; re-run quantize")


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

