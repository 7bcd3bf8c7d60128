"""The identity of the run that writes an output folder (``embed_run.json``, ``fold_run.json``), and comparing them.

An identity is a JSON object: the tool, the model (names and digests, never a local
path), the options that change outputs, and the digest of the input's content. The
first run into a folder records it; every later run (a resume, another shard, a
torchrun rank) compares its own and is refused in one line naming the first field
that differs. Comparison happens twice: before the model loads, with what is known
of the model then (its name, an artifact's digest), so a wrong model costs no load;
and after, with the whole identity, under a short lock so that concurrent shards
write the file once.

:func:`identity_difference` is also what each output file's own record is compared with
(:mod:`ptq_protein.workloads.embed_seal`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from ptq_protein.artifact.seal import canonical_json, first_difference
from ptq_protein.support.errors import InputError
from ptq_protein.support.file_reads import read_json
from ptq_protein.support.io_utils import atomic_write_text, file_lock

__all__ = ["RunManifest", "identity_difference", "plain_json"]


def plain_json(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists): what a comparison must see."""
    return json.loads(json.dumps(value))


def identity_difference(have: Mapping[str, Any], want: Mapping[str, Any]) -> Optional[Tuple[str, str, str]]:
    """(``what``, the value in ``have``, the value in ``want``) at the first difference, or None when equal.

    ``what`` is the field as a user reads it (``model.sha256``, ``options.repr_layers``, ``FASTA content``);
    the values are shown as ``repr``, or ``nothing`` where one side lacks the field.
    """
    if canonical_json(have) == canonical_json(want):  # the common case, one comparison (a resume checks each file)
        return None
    where = first_difference(have, want)
    if where is None:
        return None
    where, _, note = where.partition(" (")
    if where.split("/")[-1].isdigit():  # one element of a list: show the whole list
        where = where.rsplit("/", 1)[0]
    what = "FASTA content" if where == "fasta_sha256" else where.replace("/", ".")
    shown = [repr(_value_at(side, where)) for side in (have, want)]
    if note.startswith("missing"):
        shown[0] = "nothing"
    elif note.startswith("not in"):
        shown[1] = "nothing"
    return what, shown[0], shown[1]


def _value_at(obj: Any, where: str) -> Any:
    for part in where.split("/") if where != "<top>" else ():
        if isinstance(obj, Mapping) and part in obj:
            obj = obj[part]
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return None
    return obj


class RunManifest:
    """``folder/name``: the identity of the run that writes ``folder``, recorded once and compared after.

    ``what`` names the outputs in messages ("embeddings", "folds").
    """

    def __init__(self, folder: Path, name: str, tool: str, what: str):
        self.folder, self.name, self.tool, self.what = Path(folder), name, tool, what
        self.path = self.folder / name

    def read(self) -> Optional[Dict[str, Any]]:
        """The recorded identity (None when there is none); an unreadable or foreign file is one line."""
        if not self.path.exists() and not self.path.is_symlink():
            return None
        if not self.path.is_file():
            raise InputError(f"{self.path} is not a regular file; move it away or choose a new --out folder")
        data = read_json(self.path, "move the folder away or choose a new --out folder")
        if not isinstance(data, dict) or data.get("tool") != self.tool:
            raise InputError(f"{self.path} was not written by '{self.tool}'; choose a new --out folder")
        return data

    def check(self, want: Mapping[str, Any], model_hint: Optional[Mapping[str, Any]] = None) -> bool:
        """Compare ``want`` (without its model) and ``model_hint`` with the record, before the model loads.

        Returns whether a record exists.
        """
        have = self.read()
        if have is None:
            return False
        want = {k: v for k, v in plain_json(dict(want)).items() if k != "model"}
        if model_hint:
            want["model"] = plain_json(dict(model_hint))
            have = {**have, "model": {k: v for k, v in (have.get("model") or {}).items() if k in model_hint}}
        self.compare(have, want)
        return True

    def bind(self, identity: Mapping[str, Any]) -> None:
        """Record ``identity`` (the first run) or compare it with the record (every later one), under a lock."""
        with file_lock(self.folder / f".{self.name}.lock", purpose=str(self.path)):
            have = self.read()
            if have is None:
                atomic_write_text(self.path, json.dumps(dict(identity), indent=2, sort_keys=True) + "\n")
            else:
                self.compare(have, identity)

    def compare(self, have: Mapping[str, Any], want: Mapping[str, Any]) -> None:
        found = identity_difference({k: v for k, v in have.items() if k in want}, plain_json(dict(want)))
        if found is not None:
            what, recorded, this = found
            raise InputError(f"--out {self.folder} holds {self.what} of another run ({what} differs: {self.name} "
                             f"has {recorded}, this run {this}); choose a new --out folder, or rerun with the "
                             "same model, options and FASTA")
