"""The output folder of ``ptq-protein embed``: what it holds, resumes, and reading it back.

A folder holds ``embed_run.json`` (the run's identity: the model or artifact and
its digests, the options, and the sha256 of the FASTA's content) and either one
``LABEL.pt`` per sequence (``--format pt``, exactly the files fair-esm's
``extract.py`` writes) or, per shard, ``embeddings.K-of-N.h5`` (``--format h5``).
While an HDF5 shard runs, each batch is a part file ``parts-K-of-N/NNNNNN.h5``;
at the end of the shard they are merged into one file and removed.

Every file is written whole (temp file, then rename) and sealed with the run's
identity (:mod:`~ptq_protein.workloads.embed_seal`), so a killed run leaves only
finished sequences, and a rerun counts as written only the sequences of files
sealed by this very run: damaged files and files of another run are embedded
again (and replaced), with one warning. A rerun with another model, recipe,
option or FASTA content is refused in one line, before anything is computed.
Shards (``--shard K/N`` or torchrun ranks) share one folder: the identity is
written once under a lock, each shard's files are its own, and one process at a
time runs a shard (a second one is refused in one line).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set

from ptq_protein.support.digests import records_digest
from ptq_protein.support.errors import InputError
from ptq_protein.support.io_utils import atomic_write_bytes, file_lock, open_lock_file
from ptq_protein.workloads import embed_h5
from ptq_protein.workloads.embed_options import FORMATS
from ptq_protein.workloads.embed_seal import (
    UnusableOutput,
    label_stem,
    load_pt,
    pt_bytes,
)
from ptq_protein.workloads.run_manifest import RunManifest, plain_json
from ptq_protein.workloads.shards import Shard

__all__ = ["MANIFEST", "EmbedFolder", "records_digest", "label_stem", "read_embeddings"]

log = logging.getLogger(__name__)

MANIFEST = "embed_run.json"
_LOCK = ".embed.lock"
_TOOL = "ptq-protein embed"


def _manifest(out_dir: Path) -> RunManifest:
    return RunManifest(out_dir, MANIFEST, _TOOL, "embeddings")


class EmbedFolder:
    """One shard's view of an output folder: check it, then write results into it."""

    def __init__(self, out_dir: Path, identity: Mapping[str, Any], fmt: str, shard: Shard):
        self.out_dir, self.fmt, self.shard = Path(out_dir), fmt, shard
        self.identity = plain_json(dict(identity))  # as the manifest will read back (lists, not tuples)
        self.manifest = _manifest(self.out_dir)
        self.unusable: Dict[Path, str] = {}  # output files not sealed by this run -> why
        self._held = contextlib.ExitStack()

    # -- before the model loads ------------------------------------------------------------
    def check(self, model_hint: Optional[Mapping[str, Any]] = None) -> None:
        """Refuse a folder that is a file, unwritable, foreign, made by another run, or whose shard another
        process is running (one line each); then hold this shard until :meth:`release`.

        ``model_hint``: what is known of the model before loading it (its name, an
        artifact's digest), compared now so that a wrong model costs no load.
        """
        out = self.out_dir
        if out.is_symlink() and not out.exists():
            raise InputError(f"--out {out} is a link to {out.readlink()}, which does not exist; give a folder")
        if out.exists() and not out.is_dir():
            raise InputError(f"--out {out} is a file; give a folder (new, or one an earlier embed run wrote)")
        try:
            out.mkdir(parents=True, exist_ok=True)
            os.close(open_lock_file(out / _LOCK))  # can we write here? (never through a planted link)
        except OSError as err:
            raise InputError(f"--out {out} cannot be written ({err.strerror}); choose a folder you can write") from err
        if not self.manifest.check(self.identity, model_hint):
            stray = [p.name for p in out.iterdir() if not p.name.startswith(".")]
            if stray:
                raise InputError(f"--out {out} holds files an embed run did not write ({stray[0]}, ...); choose a new "
                                 "or empty folder")
        self._held.enter_context(file_lock(out / f".embed-{self.shard.tag}.lock", wait=False,
                                           purpose=f"shard {self.shard.tag} of {out}"))
        if self.fmt == "h5":
            self._parts_dir(create=False)

    def release(self) -> None:
        """Let another process run this shard (the lock taken by :meth:`check`)."""
        self._held.close()

    # -- after the model loaded ------------------------------------------------------------
    def bind(self, model_identity: Mapping[str, Any]) -> Set[str]:
        """Record (or compare) the whole identity, model included; returns the labels already written."""
        self.identity["model"] = plain_json(dict(model_identity))
        self.manifest.bind(self.identity)
        return self.written_labels()

    def written_labels(self) -> Set[str]:
        """Labels of the files sealed by this run, their tensors checked against the seal; the others are noted."""
        written: Set[str] = set()
        self.unusable = {}
        for path in self._files():
            try:
                written.update(self._sealed_labels(path))
            except UnusableOutput as err:
                if path.exists():  # not a part another shard merged away meanwhile
                    self.unusable[path] = str(err)
        if self.unusable:
            log.warning("%d file(s) in %s are damaged or from another run and count as not written; their "
                        "sequences of this shard are embedded again. First: %s", len(self.unusable), self.out_dir,
                        next(iter(self.unusable.values())))
        return written

    def is_written(self, label: str, written: Set[str]) -> bool:
        return label in written

    def write(self, results: Sequence[Mapping[str, Any]]) -> None:
        """Each result whole: a ``LABEL.pt`` each (pt), or one part file for the batch (h5)."""
        if self.fmt == "pt":
            for result in results:
                atomic_write_bytes(self.out_dir / f"{label_stem(result['label'])}.pt", pt_bytes(result, self.identity))
            return
        parts = self._parts_dir()  # this process holds the shard: numbering cannot race
        number = 1 + max((int(p.stem) for p in parts.glob("*.h5") if p.stem.isdigit()), default=0)
        embed_h5.write_h5(parts / f"{number:06d}.h5", results, [label_stem(r["label"]) for r in results],
                          self.identity)

    def finish(self) -> Optional[Path]:
        """h5: merge this shard's sealed part files (and its earlier shard file) into ``embeddings.K-of-N.h5``
        (whole, then the parts go); a damaged or foreign shard file is replaced. Then name any file, not this
        run's, that this run did not replace: :func:`read_embeddings` refuses the folder until it is moved."""
        merged = self._merge() if self.fmt == "h5" else None
        left = [path for path in self.unusable if path.exists() and not self._usable(path)]
        if left:
            more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
            log.warning("%s%s is damaged or another run's and was not replaced: read_embeddings refuses %s until "
                        "it is moved away", left[0], more, self.out_dir)
        return merged

    def _merge(self) -> Optional[Path]:
        parts_dir = self._parts_dir()
        parts = sorted(parts_dir.glob("*.h5"))
        final = self.out_dir / f"embeddings.{self.shard.tag}.h5"
        if not parts and final not in self.unusable:
            shutil.rmtree(parts_dir)
            return final if final.exists() else None
        merged: Dict[str, Dict[str, Any]] = {}
        for path in ([final] if final.exists() else []) + parts:
            try:
                merged.update(embed_h5.read_h5(path, self.identity))
            except UnusableOutput as err:
                log.warning("not merged: %s", err)
        if merged:
            embed_h5.write_h5(final, list(merged.values()), [label_stem(k) for k in merged], self.identity)
        elif final.exists():
            final.unlink()
        shutil.rmtree(parts_dir)  # this process holds the shard: all in it is this shard's (temps of a killed run too)
        return final if merged else None

    # -- helpers -------------------------------------------------------------------------------
    def _files(self) -> List[Path]:
        return sorted(self.out_dir.glob("*.pt")) if self.fmt == "pt" else _h5_files(self.out_dir)

    def _sealed_labels(self, path: Path) -> List[str]:
        """The labels of ``path`` once its seal and its tensors' digests are checked, as :func:`read_embeddings`
        checks them: a file edited inside its seal is embedded again, not counted as written."""
        if self.fmt == "pt":
            return [load_pt(path, self.identity, "this run")["label"]]
        return embed_h5.h5_checked_labels(path, self.identity)

    def _usable(self, path: Path) -> bool:
        try:
            self._sealed_labels(path)
        except UnusableOutput:
            return False
        return True

    def _parts_dir(self, create: bool = True) -> Path:
        """This shard's part folder: a real folder inside ``--out``, never a link to one elsewhere."""
        path = self.out_dir / f"parts-{self.shard.tag}"
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            self.release()
            raise InputError(f"{path} is {'a link' if path.is_symlink() else 'not a folder'}; remove it (ptq-protein "
                             "writes this shard's part files into a folder of that name it creates itself)")
        if create:
            path.mkdir(exist_ok=True)
        return path


def _h5_files(out_dir: Path) -> List[Path]:
    return sorted(out_dir.glob("embeddings.*.h5")) + sorted(out_dir.glob("parts-*/*.h5"))


def read_embeddings(out_dir) -> Dict[str, Dict[str, Any]]:
    """Every sequence an embed run wrote into `out_dir`: {label: the dict fair-esm's `extract.py` saves}.

    Reads `LABEL.pt` files (`torch.load(weights_only=True)`) or every HDF5
    shard (finished or still in parts); the same dict either way. Each file
    is checked against `embed_run.json` and its tensors against their sealed
    digest: a damaged file, or one another run wrote, is an `InputError`
    naming it (rerunning the embed command recomputes it).

    Example
    -------
    >>> emb = read_embeddings("runs/emb")
    >>> sorted(emb.get("P12345").get("mean_representations"))
    [33]
    """
    out_dir = Path(out_dir)
    identity = _manifest(out_dir).read()
    if identity is None:
        raise InputError(f"{out_dir} has no {MANIFEST}: not a folder 'ptq-protein embed' wrote")
    fmt = (identity.get("options") or {}).get("format") if isinstance(identity.get("options"), dict) else None
    if fmt not in FORMATS:
        raise InputError(f"{out_dir / MANIFEST} records format {fmt!r}, not one of {', '.join(FORMATS)}: the file was "
                         "edited or damaged; rerun the embed command into a new --out folder")
    merged: Dict[str, Dict[str, Any]] = {}
    for path in sorted(out_dir.glob("*.pt")):  # whatever the format: a file of another run is named, not skipped
        result = load_pt(path, identity)
        merged[result["label"]] = result
    for path in _h5_files(out_dir):
        merged.update(embed_h5.read_h5(path, identity))
    return merged
