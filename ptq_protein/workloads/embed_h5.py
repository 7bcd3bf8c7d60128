"""Embedding dicts in HDF5 (h5py): one group per sequence, the same dict back when read.

Layout of a file: attributes ``ptq_protein_embed`` (the run's identity as JSON:
model, recipe, artifact digest, options, FASTA digest); one group per sequence,
named by :func:`~ptq_protein.workloads.embed_store.label_stem`, with attribute
``label``; in it the datasets ``representations/<layer>``,
``mean_representations/<layer>``, ``bos_representations/<layer>``, ``contacts``
and ``logits``, as present. h5py is imported lazily (the ``h5`` extra).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

import numpy as np
import torch

__all__ = ["write_h5", "read_h5", "labels_in_h5", "require_h5py", "IDENTITY_ATTR"]

IDENTITY_ATTR = "ptq_protein_embed"
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
    """Write ``results`` (extract.py dicts) to ``path`` through a temp file, then rename: never half a file."""
    h5py = require_h5py()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as handle:
            handle.attrs[IDENTITY_ATTR] = json.dumps(identity, sort_keys=True)
            for stem, result in zip(stems, results):
                _write_group(handle.create_group(stem), result)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_group(group, result: Mapping[str, Any]) -> None:
    group.attrs["label"] = result["label"]
    for key in _LAYER_KEYS:
        if key in result:
            sub = group.create_group(key)
            for layer, tensor in result[key].items():
                sub.create_dataset(str(layer), data=tensor.numpy())
    for key in _TENSOR_KEYS:
        if key in result:
            group.create_dataset(key, data=result[key].numpy())


def read_h5(path: Path) -> Dict[str, Dict[str, Any]]:
    """{label: the dict ``extract.py`` would have saved} for every sequence in ``path``."""
    h5py = require_h5py()
    out: Dict[str, Dict[str, Any]] = {}
    with h5py.File(path, "r") as handle:
        for group in handle.values():
            result: Dict[str, Any] = {"label": str(group.attrs["label"])}
            for key in _LAYER_KEYS:
                if key in group:
                    result[key] = {int(layer): torch.from_numpy(np.asarray(ds)) for layer, ds in group[key].items()}
            for key in _TENSOR_KEYS:
                if key in group:
                    result[key] = torch.from_numpy(np.asarray(group[key]))
            out[result["label"]] = result
    return out


def labels_in_h5(path: Path) -> List[str]:
    """The labels a file holds, without reading its tensors."""
    h5py = require_h5py()
    with h5py.File(path, "r") as handle:
        return [str(group.attrs["label"]) for group in handle.values()]


def identity_in_h5(path: Path) -> Dict[str, Any]:
    h5py = require_h5py()
    with h5py.File(path, "r") as handle:
        return json.loads(handle.attrs[IDENTITY_ATTR])
