"""Read an artifact's ``model.safetensors`` into tensors this process owns, one tensor at a time.

safetensors' ``load_file`` maps the file and returns views of the mapping: every page the seal check
reads stays resident (as this process's file pages) while the model's own copies are made, so a load
held the tensors twice. A 3B-sized int8 artifact (2.7 GiB of codes) peaked at 5.8 GiB resident
(docs/benchmarks-history.md). Plain reads into owned tensors hold them once: the page cache the reads
go through is the kernel's, reclaimable and not this process's. The model then adopts these tensors
without a copy (``load_state_dict(assign=True)`` in :func:`ptq_protein.artifact.save_load.load`).

The layout read is safetensors' own: an 8-byte little-endian header length, a JSON header giving each
tensor's dtype, shape and byte range, then the bytes. Loading has already checked the whole file's
sha256 against the seal, and checks every tensor against the sealed digest after this read.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from ptq_protein.support.errors import ArtifactError

__all__ = ["read_tensors", "map_tensors", "check_header"]

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
_METADATA = "__metadata__"
_MAX_HEADER = 100_000_000  # safetensors' own limit on a header (its Rust reader refuses more)


def _header(handle, file: Path) -> Tuple[Dict[str, dict], int]:
    """The header's tensor entries and the offset their byte ranges count from."""
    size_bytes = handle.read(8)
    if len(size_bytes) != 8:
        raise ArtifactError(f"{file} is too short for a safetensors header; re-run quantize")
    (size,) = struct.unpack("<Q", size_bytes)
    room = os.fstat(handle.fileno()).st_size - 8
    if size > min(room, _MAX_HEADER):  # bounded before reading: 2**40 asked for a terabyte (MemoryError)
        raise ArtifactError(f"{file} declares a safetensors header of {size} bytes (the file holds {max(room, 0)} "
                            f"after the size field; safetensors allows {_MAX_HEADER}); the file is corrupt: re-run "
                            "quantize")
    raw = handle.read(size)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise ArtifactError(f"{file} has an unreadable safetensors header; re-run quantize") from err
    if len(raw) != size or not isinstance(header, dict):
        raise ArtifactError(f"{file} has a truncated safetensors header; re-run quantize")
    header.pop(_METADATA, None)
    return header, 8 + size


def _entry(name: str, entry: dict, file: Path) -> Tuple[torch.dtype, List[int], int, int]:
    """(dtype, shape, start, stop) of a header entry, checked: a dtype this loader does not know is named."""
    if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPES:
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        raise ArtifactError(f"{file}: tensor {name!r} has dtype {dtype!r}, which no ptq-protein artifact holds "
                            f"(known: {', '.join(_DTYPES)}); the file is corrupt or from another tool: re-run quantize")
    try:
        shape = [int(n) for n in entry["shape"]]
        start, stop = (int(n) for n in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as err:
        raise ArtifactError(f"{file}: tensor {name!r} has an unreadable header entry; re-run quantize") from err
    dtype = _DTYPES[entry["dtype"]]
    if min(shape, default=0) < 0 or start < 0 or stop - start != math.prod(shape) * dtype.itemsize:
        raise ArtifactError(f"{file}: tensor {name!r} has a byte range that does not fit its dtype and shape; "
                            "re-run quantize")
    return dtype, shape, start, stop


def check_header(file: Path) -> None:
    """Every header entry of ``file`` checked (dtype, shape, byte range) before safetensors reads it: its own
    messages for an unknown dtype speak of sub-byte types, not of a damaged artifact."""
    with open(file, "rb") as handle:
        header, _ = _header(handle, file)
    for name, entry in header.items():
        _entry(name, entry, file)


def read_tensors(file: Path) -> Dict[str, torch.Tensor]:
    """Every tensor of the safetensors ``file``, each read into its own memory (no mapping of the file)."""
    tensors: Dict[str, torch.Tensor] = {}
    with open(file, "rb") as handle:
        header, base = _header(handle, file)
        planned = [(name, *_entry(name, entry, file)) for name, entry in header.items()]  # every entry checked
        for name, dtype, shape, start, _ in sorted(planned, key=lambda item: item[3]):  # then read in file order
            tensor = torch.empty(shape, dtype=dtype)
            handle.seek(base + start)
            _read_into(handle, memoryview(tensor.reshape(-1).view(torch.uint8).numpy()), name, file)
            tensors[name] = tensor
    return tensors


def map_tensors(file: Path) -> Dict[str, torch.Tensor]:
    """Every tensor of the safetensors ``file`` as a view of one private mapping of the whole file.

    For a model that streams its weights (``ptq-protein fold``: :mod:`ptq_protein.models.mapped` hands
    a layer's pages back after its forward), so that they are read from the page cache when used
    instead of held. The mapping is private (copy-on-write): a tensor edited in place never
    changes the file. A tensor whose offset does not suit its dtype's alignment (safetensors' own
    writer aligns them) is read into memory instead.
    """
    with open(file, "rb") as handle:
        header, base = _header(handle, file)
        planned = [(name, *_entry(name, entry, file)) for name, entry in header.items()]
    size = file.stat().st_size
    if any(base + stop > size for *_, stop in planned):
        raise ArtifactError(f"{file} ends inside a tensor; the file is truncated: re-run quantize")
    whole = torch.empty(0, dtype=torch.uint8)
    if size:
        whole.set_(torch.UntypedStorage.from_file(str(file), False, size))  # shared=False: MAP_PRIVATE
    tensors: Dict[str, torch.Tensor] = {}
    for name, dtype, shape, start, stop in planned:
        raw = whole[base + start:base + stop]
        if (base + start) % dtype.itemsize:
            raw = raw.clone()  # unaligned for its dtype: a copy of its own
        tensors[name] = raw.view(dtype).reshape(shape)
    return tensors


def _read_into(handle, view: memoryview, name: str, file: Path) -> None:
    """Fill ``view`` from ``handle`` (a read can return less than asked, e.g. over 2 GiB on Linux)."""
    done = 0
    while done < len(view):
        got = handle.readinto(view[done:])
        if not got:
            raise ArtifactError(f"{file} ends inside tensor {name!r}; the file is truncated: re-run quantize")
        done += got
