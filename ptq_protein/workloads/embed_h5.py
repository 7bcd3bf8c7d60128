"""Embedding dicts in HDF5 (h5py): one group per sequence, the same dict back when read.

Layout of a file: attributes ``ptq_protein_embed`` (the run's identity as JSON:
model, recipe, artifact digest, options, FASTA digest); one group per sequence,
named by :func:`~ptq_protein.workloads.embed_seal.label_stem`, with attributes
``label`` and ``tensors_sha256`` (:func:`~ptq_protein.workloads.embed_seal.result_sha256`);
in it the datasets ``representations/<layer>``, ``mean_representations/<layer>``,
``bos_representations/<layer>``, ``contacts`` and ``logits``, as present. h5py is
imported lazily (the ``h5`` extra). A file that h5py cannot read, or whose identity
or digests do not match, is :class:`~ptq_protein.workloads.embed_seal.UnusableOutput`.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Sequence

import numpy as np
import torch

from ptq_protein.support.io_utils import atomic_write_bytes
from ptq_protein.workloads.embed_seal import (
    RERUN_FIX,
    UnusableOutput,
    check_identity,
    check_result,
    result_sha256,
)

__all__ = ["write_h5", "read_h5", "h5_checked_labels", "require_h5py", "IDENTITY_ATTR"]

IDENTITY_ATTR = "ptq_protein_embed"
_DIGEST_ATTR = "tensors_sha256"
_LAYER_KEYS = ("representations", "mean_representations", "bos_representations")
_TENSOR_KEYS = ("contacts", "logits")


def require_h5py():
    """h5py, or one line saying how to install it."""
    try:
        import h5py
    except ImportError as err:
        raise ValueError("--format h5 needs h5py: pip install h5py (or pip install -e '.[h5]'); or use --format pt")\
            from err
    return h5py


def write_h5(path: Path, results: Sequence[Mapping[str, Any]], stems: Sequence[str], identity: Mapping) -> None:
    """Write ``results`` (extract.py dicts) to ``path`` through a temp file, then rename: never half a file.

    The file is built in memory and written as plain bytes: a full disk is then one ``OSError`` naming
    ``path``, where HDF5's own writer printed thousands of lines of errors and crashed the process (SIGSEGV).
    """
    h5py = require_h5py()
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as handle:
        handle.attrs[IDENTITY_ATTR] = json.dumps(identity, sort_keys=True)
        for stem, result in zip(stems, results):
            _write_group(handle.create_group(stem), result)
    atomic_write_bytes(path, buffer.getvalue())


def _write_group(group, result: Mapping[str, Any]) -> None:
    group.attrs["label"] = result["label"]
    group.attrs[_DIGEST_ATTR] = result_sha256(result)
    for key in _LAYER_KEYS:
        if key in result:
            sub = group.create_group(key)
            for layer, tensor in result[key].items():
                sub.create_dataset(str(layer), data=tensor.numpy())
    for key in _TENSOR_KEYS:
        if key in result:
            group.create_dataset(key, data=result[key].numpy())


def read_h5(path: Path, identity: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """{label: the dict ``extract.py`` would have saved} for every sequence in ``path``, each checked against
    its digest, the file against ``identity`` (``embed_run.json``'s)."""
    with _opened(path) as handle:
        check_identity(path, _identity(path, handle), identity, "embed_run.json")
        return {result["label"]: result for result in _checked_results(path, handle)}


def h5_checked_labels(path: Path, identity: Mapping[str, Any], against: str = "this run") -> List[str]:
    """The labels of ``path`` once its identity and every group's tensors are checked against their digest,
    one group in memory at a time (what a resume counts as written)."""
    with _opened(path) as handle:
        check_identity(path, _identity(path, handle), identity, against)
        return [result["label"] for result in _checked_results(path, handle)]


def _checked_results(path: Path, handle) -> Iterator[Dict[str, Any]]:
    for group in handle.values():
        if _DIGEST_ATTR not in group.attrs:
            raise UnusableOutput(f"{path} holds {group.name} without a tensor digest (written by an older "
                                 f"ptq-protein); {RERUN_FIX}")
        result: Dict[str, Any] = {"label": str(group.attrs["label"])}
        for key in _LAYER_KEYS:
            if key in group:
                result[key] = {int(layer): torch.from_numpy(np.asarray(ds)) for layer, ds in group[key].items()}
        for key in _TENSOR_KEYS:
            if key in group:
                result[key] = torch.from_numpy(np.asarray(group[key]))
        check_result(path, result, group.attrs.get(_DIGEST_ATTR))
        yield result


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[Any]:
    """``h5py.File(path, "r")``; a failure to open or walk it (truncated, not HDF5, a group without a label)
    is one :class:`UnusableOutput` naming ``path``."""
    h5py = require_h5py()
    try:
        with h5py.File(path, "r") as handle:
            yield handle
    except UnusableOutput:
        raise
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as err:
        raise UnusableOutput(f"{path} is damaged: not a whole HDF5 file of an embed run ({type(err).__name__}: "
                             f"{' '.join(str(err).split())[:80]}); {RERUN_FIX}") from err


def _identity(path: Path, handle) -> Dict[str, Any]:
    try:
        identity = json.loads(handle.attrs[IDENTITY_ATTR])
    except (KeyError, TypeError, ValueError) as err:
        raise UnusableOutput(f"{path} records no run identity (attribute {IDENTITY_ATTR}); {RERUN_FIX}") from err
    if not isinstance(identity, dict):
        raise UnusableOutput(f"{path} records no run identity (attribute {IDENTITY_ATTR}); {RERUN_FIX}")
    return identity
