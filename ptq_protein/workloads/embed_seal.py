"""What each file of an embed folder says about the run that wrote it: checked on resume and on read.

A file name proves nothing: a ``LABEL.pt`` copied in from another model's folder, a
truncated one or a pickle named ``.pt`` all look written. So every output carries a
*seal*: the identity of its run (as ``embed_run.json`` records it: model and its
digests, options, FASTA digest), its label(s), and the digest of its tensors
(:func:`~ptq_protein.artifact.seal.tensors_sha256`).

- ``LABEL.pt``: the zip archive ``torch.save`` writes, plus one record
  ``<archive>/ptq_protein_embed.json``. ``torch.load`` ignores records it does not
  know, so the file stays what fair-esm's ``extract.py`` writes and reads.
- HDF5 files (:mod:`~ptq_protein.workloads.embed_h5`): the identity as a file
  attribute, the tensors' digest as an attribute of each sequence's group.

A resume reads only the seal (a zip's directory and one small record; an HDF5 file's
attributes), never the tensors, and never unpickles: a file that is not a sealed
zip (empty, truncated, a pickle) is damaged, one sealed by another run is foreign;
neither counts as written. A read checks the seal, then the tensors against their
digest, and names the file of any problem (:class:`UnusableOutput`).
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any, Dict, Mapping

import torch

from ptq_protein.artifact.seal import tensors_sha256
from ptq_protein.support.errors import InputError
from ptq_protein.support.io_utils import safe_stem
from ptq_protein.workloads.run_manifest import identity_difference

__all__ = ["SEAL_RECORD", "RERUN_FIX", "UnusableOutput", "label_stem", "result_sha256", "pt_bytes", "pt_seal",
           "check_identity", "check_name", "load_pt", "check_result"]

SEAL_RECORD = "ptq_protein_embed.json"
RERUN_FIX = "rerun the embed command that wrote the folder: it embeds such files' sequences again"


class UnusableOutput(InputError):
    """An output file that is damaged or was written by another run; the message names it and the fix."""


def label_stem(label: str) -> str:
    """The file stem of a label: the label itself where it is a plain file name (as ``extract.py``), else
    :func:`~ptq_protein.support.io_utils.safe_stem` (a ``/`` would make a folder, a leading ``.`` a hidden file,
    a control character such as ESC, BEL or a tab would reach terminals raw through ``ls``).

    Distinct labels get distinct stems: a kept label holds no ``~``, and every stem ``safe_stem`` makes
    for a label it changes ends in ``~`` and a digest of the label.
    """
    plain = label and label.isprintable() and not any(c in label for c in "/~") and not label.startswith(".")
    return label if plain and len(label.encode()) <= 200 else safe_stem(label)


def result_sha256(result: Mapping[str, Any]) -> str:
    """Digest of every tensor of an ``extract.py`` dict, by key (``representations/33``, ``contacts``)."""
    flat: Dict[str, torch.Tensor] = {}
    for key, value in result.items():
        if isinstance(value, Mapping):
            flat.update({f"{key}/{layer}": tensor for layer, tensor in value.items()})
        elif torch.is_tensor(value):
            flat[key] = value
    return tensors_sha256(flat)


def pt_bytes(result: Mapping[str, Any], identity: Mapping[str, Any]) -> bytes:
    """``torch.save(result)`` with the seal record added to its zip archive."""
    buffer = io.BytesIO()
    torch.save(dict(result), buffer)
    seal = {"identity": identity, "label": result["label"], "tensors_sha256": result_sha256(result)}
    with zipfile.ZipFile(buffer, "a") as archive:
        root = archive.namelist()[0].split("/", 1)[0]
        archive.writestr(f"{root}/{SEAL_RECORD}", json.dumps(seal, sort_keys=True))
    return buffer.getvalue()


def pt_seal(path: Path) -> Dict[str, Any]:
    """The seal of a ``LABEL.pt`` (its zip directory and one record read; no tensor, no unpickling)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith("/" + SEAL_RECORD)]
            if not names:
                raise UnusableOutput(f"{path} carries no ptq-protein seal (written by another tool or an older "
                                     f"ptq-protein); {RERUN_FIX}")
            seal = json.loads(archive.read(names[0]))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RecursionError) as err:
        if isinstance(err, UnusableOutput):
            raise
        raise UnusableOutput(f"{path} is damaged: not a whole torch.save file ({type(err).__name__}: "
                             f"{' '.join(str(err).split())[:80]}); {RERUN_FIX}") from err
    if not (isinstance(seal, dict) and isinstance(seal.get("identity"), dict) and isinstance(seal.get("label"), str)
            and isinstance(seal.get("tensors_sha256"), str)):
        raise UnusableOutput(f"{path} has a malformed seal; {RERUN_FIX}")
    return seal


def check_identity(path: Path, have: Mapping[str, Any], want: Mapping[str, Any], against: str) -> None:
    """Refuse a file whose recorded identity ``have`` differs from ``want`` (``against``: whose identity)."""
    found = identity_difference(dict(have), dict(want))
    if found is not None:
        what, recorded, this = found
        raise UnusableOutput(f"{path} was written by another run ({what} differs: the file has {recorded}, "
                             f"{against} {this}); {RERUN_FIX}, or move the file away")


def check_result(path: Path, result: Mapping[str, Any], digest: Any) -> None:
    """Refuse tensors that differ from the digest sealed with them (a damaged file)."""
    if not isinstance(digest, str) or result_sha256(result) != digest:
        raise UnusableOutput(f"{path}: the tensors of {result.get('label')!r} differ from their sealed digest "
                             f"(the file is damaged); {RERUN_FIX}")


def check_name(path: Path, label: str) -> None:
    """Refuse a sealed file under another label's name (renamed or copied)."""
    if label_stem(label) != path.stem:
        raise UnusableOutput(f"{path} holds {label!r}, whose file is {label_stem(label)}{path.suffix} (the file "
                             f"was renamed or copied); {RERUN_FIX}, or move the file away")


def load_pt(path: Path, identity: Mapping[str, Any], against: str = "embed_run.json") -> Dict[str, Any]:
    """The result in ``path``, checked: sealed by ``identity`` (``against``: whose, for messages), under its
    label's name, tensors intact."""
    seal = pt_seal(path)
    check_identity(path, seal["identity"], identity, against)
    check_name(path, seal["label"])
    try:
        result = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 -- torch raises many types for a damaged archive
        raise UnusableOutput(f"{path} is damaged ({type(err).__name__}: {' '.join(str(err).split())[:80]}); "
                             f"{RERUN_FIX}") from err
    if not isinstance(result, dict) or result.get("label") != seal["label"]:
        raise UnusableOutput(f"{path} does not hold the sequence its seal names ({seal['label']!r}); {RERUN_FIX}")
    check_result(path, result, seal["tensors_sha256"])
    return result
