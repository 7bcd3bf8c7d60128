"""The output folder of ``ptq-protein embed``: what it holds, resumes, and reading it back.

A folder holds ``embed_run.json`` (the run's identity: the model or artifact and
its digest, the options, and the sha256 of the FASTA's content) and either one
``LABEL.pt`` per sequence (``--format pt``, exactly the files fair-esm's
``extract.py`` writes) or, per shard, ``embeddings.K-of-N.h5`` (``--format h5``).
While an HDF5 shard runs, each batch is a part file ``parts-K-of-N/NNNNNN.h5``;
at the end of the shard they are merged into one file and removed.

Every file is written whole (temp file, then rename), so a killed run leaves
only finished sequences; a rerun computes only the labels not yet written. A
rerun with another model, recipe, option or FASTA content is refused in one
line, before anything is computed. Shards (``--shard K/N`` or torchrun ranks)
share one folder: the identity is written once under a lock, each shard's
files are its own.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set

import torch

from ptq_protein.artifact_seal import first_difference
from ptq_protein.digests import records_digest
from ptq_protein.errors import InputError
from ptq_protein.file_reads import read_json
from ptq_protein.io_utils import atomic_write_bytes, atomic_write_text, file_lock, safe_stem
from ptq_protein.workloads import embed_h5
from ptq_protein.workloads.shards import Shard

__all__ = ["MANIFEST", "EmbedFolder", "records_digest", "label_stem", "read_embeddings"]

MANIFEST = "embed_run.json"
_LOCK = ".embed.lock"
_TOOL = "ptq-protein embed"


def label_stem(label: str) -> str:
    """The file stem of a label: the label itself where it is a plain file name (as ``extract.py``), else
    :func:`~ptq_protein.io_utils.safe_stem` (a ``/`` would make a folder, a leading ``.`` a hidden file)."""
    plain = label and "/" not in label and "\0" not in label and not label.startswith(".")
    return label if plain and len(label.encode()) <= 200 else safe_stem(label)


class EmbedFolder:
    """One shard's view of an output folder: check it, then write results into it."""

    def __init__(self, out_dir: Path, identity: Mapping[str, Any], fmt: str, shard: Shard):
        self.out_dir, self.fmt, self.shard = Path(out_dir), fmt, shard
        self.identity = json.loads(json.dumps(dict(identity)))  # as the manifest will read back (lists, not tuples)

    # -- before the model loads ------------------------------------------------------------
    def check(self, model_hint: Optional[Mapping[str, Any]] = None) -> None:
        """Refuse a folder that is a file, unwritable, foreign, or made by another run (one line each).

        ``model_hint``: what is known of the model before loading it (its name, an
        artifact's digest), compared now so that a wrong model costs no load.
        """
        out = self.out_dir
        if out.exists() and not out.is_dir():
            raise InputError(f"--out {out} is a file; give a folder (new, or one an earlier embed run wrote)")
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe = out / _LOCK
            probe.touch(exist_ok=True)
        except OSError as err:
            raise InputError(f"--out {out} cannot be written ({err.strerror}); choose a folder you can write") from err
        have = self._read_manifest()
        if have is None:
            stray = [p.name for p in out.iterdir() if p.name != _LOCK]
            if stray:
                raise InputError(f"--out {out} holds files an embed run did not write ({stray[0]}, ...); choose a new "
                                 "or empty folder")
            return
        want = {k: v for k, v in self.identity.items() if k != "model"}
        if model_hint:
            want["model"] = json.loads(json.dumps(dict(model_hint)))
            have = {**have, "model": {k: v for k, v in (have.get("model") or {}).items() if k in model_hint}}
        self._compare(have, want)

    # -- after the model loaded ------------------------------------------------------------
    def bind(self, model_identity: Mapping[str, Any]) -> Set[str]:
        """Record (or compare) the whole identity, model included; returns the labels already written."""
        self.identity["model"] = json.loads(json.dumps(dict(model_identity)))
        with file_lock(self.out_dir / _LOCK, purpose=f"output folder {self.out_dir}"):
            have = self._read_manifest()
            if have is None:
                atomic_write_text(self.out_dir / MANIFEST, json.dumps(self.identity, indent=2, sort_keys=True) + "\n")
            else:
                self._compare(have, self.identity)
        return self.written_labels()

    def written_labels(self) -> Set[str]:
        if self.fmt == "pt":
            return {p.stem for p in self.out_dir.glob("*.pt")}  # stems; callers compare label_stem(label)
        return {label for path in _h5_files(self.out_dir) for label in embed_h5.labels_in_h5(path)}

    def is_written(self, label: str, written: Set[str]) -> bool:
        return (label_stem(label) if self.fmt == "pt" else label) in written

    def write(self, results: Sequence[Mapping[str, Any]]) -> None:
        """Each result whole: a ``LABEL.pt`` each (pt), or one part file for the batch (h5)."""
        if self.fmt == "pt":
            for result in results:
                buffer = io.BytesIO()
                torch.save(dict(result), buffer)
                atomic_write_bytes(self.out_dir / f"{label_stem(result['label'])}.pt", buffer.getvalue())
            return
        parts = self._parts_dir()
        number = 1 + max((int(p.stem) for p in parts.glob("*.h5") if p.stem.isdigit()), default=0)
        embed_h5.write_h5(parts / f"{number:06d}.h5", results, [label_stem(r["label"]) for r in results],
                          self.identity)

    def finish(self) -> Optional[Path]:
        """h5: merge this shard's part files into ``embeddings.K-of-N.h5`` (whole, then the parts go)."""
        if self.fmt != "h5":
            return None
        parts = self._parts_dir()
        files = sorted(parts.glob("*.h5"))
        final = self.out_dir / f"embeddings.{self.shard.tag}.h5"
        if not files:
            return final if final.exists() else None
        merged: Dict[str, Dict[str, Any]] = embed_h5.read_h5(final) if final.exists() else {}
        for path in files:
            merged.update(embed_h5.read_h5(path))
        embed_h5.write_h5(final, list(merged.values()), [label_stem(k) for k in merged], self.identity)
        for path in files:
            path.unlink()
        parts.rmdir()
        return final

    # -- helpers -------------------------------------------------------------------------------
    def _parts_dir(self) -> Path:
        path = self.out_dir / f"parts-{self.shard.tag}"
        path.mkdir(exist_ok=True)
        return path

    def _read_manifest(self) -> Optional[Dict[str, Any]]:
        path = self.out_dir / MANIFEST
        if not path.exists():
            return None
        data = read_json(path, "move the folder away or choose a new --out")
        if not isinstance(data, dict) or data.get("tool") != _TOOL:
            raise InputError(f"{path} was not written by '{_TOOL}'; choose a new --out folder")
        return data

    def _compare(self, have: Mapping[str, Any], want: Mapping[str, Any]) -> None:
        have = {k: v for k, v in have.items() if k in want}
        where = first_difference(have, want)
        if where is not None:
            where = where.split(" (")[0]
            what = "FASTA content" if where == "fasta_sha256" else where.replace("/", ".")
            raise InputError(f"--out {self.out_dir} holds embeddings of another run ({what} differs: "
                             f"{MANIFEST} has {_value_at(have, where)!r}, this run {_value_at(want, where)!r}); "
                             "choose a new --out folder, or rerun with the same model, options and FASTA")


def _value_at(obj: Any, where: str) -> Any:
    for part in where.split("/"):
        if isinstance(obj, Mapping) and part in obj:
            obj = obj[part]
        else:
            return None
    return obj


def _h5_files(out_dir: Path) -> List[Path]:
    return sorted(out_dir.glob("embeddings.*.h5")) + sorted(out_dir.glob("parts-*/*.h5"))


def read_embeddings(out_dir) -> Dict[str, Dict[str, Any]]:
    """Every sequence an embed run wrote into `out_dir`: {label: the dict fair-esm's `extract.py` saves}.

    Reads `LABEL.pt` files (`torch.load(weights_only=True)`) or every HDF5
    shard (finished or still in parts); the same dict either way.

    Example
    -------
    >>> emb = read_embeddings("runs/emb")
    >>> sorted(emb.get("P12345").get("mean_representations"))
    [33]
    """
    out_dir = Path(out_dir)
    if not (out_dir / MANIFEST).is_file():
        raise InputError(f"{out_dir} has no {MANIFEST}: not a folder 'ptq-protein embed' wrote")
    fmt = json.loads((out_dir / MANIFEST).read_text())["options"]["format"]
    if fmt == "pt":
        found = (torch.load(path, map_location="cpu", weights_only=True) for path in sorted(out_dir.glob("*.pt")))
        return {result["label"]: result for result in found}
    merged: Dict[str, Dict[str, Any]] = {}
    for path in _h5_files(out_dir):
        merged.update(embed_h5.read_h5(path))
    return merged
