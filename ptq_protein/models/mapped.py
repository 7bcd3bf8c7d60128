"""Weights read from a memory-mapped checkpoint, and handing their pages back to the OS.

``torch.load(mmap=True)`` maps the file privately: a tensor's bytes are read
from disk (or the OS page cache) when first touched and then count in the
process's resident memory for as long as the mapping lives, even once every
layer that used them has been quantized. :class:`MappedFile` records the
address range of one such mapping; :meth:`MappedFile.release` tells the kernel
(``madvise(MADV_DONTNEED)``) that the pages of some tensors are not needed now.
For a private file mapping that was never written, that is lossless: the pages
stay in the page cache (reclaimable, not this process's memory) and are mapped
again on the next touch. So a model whose weights live in a mapping can
calibrate and quantize with about one layer's float weights resident.

Safety: only tensors whose storage is one of the checkpoint's recorded
storages are released, and those stay valid because the record holds them. A
page that was written to (a weight edited in place after loading: SmoothQuant's
folding, GPTQ's rounded weights) is this process's private copy, and
``MADV_DONTNEED`` would discard the edit and map the file's bytes back in,
silently. So only pages that ``/proc/self/pagemap`` shows are still the file's
(or not resident and not swapped) are released; written pages stay as written.
Linux only; elsewhere, or where the page map cannot be read, :meth:`release`
does nothing (memory is then not bounded by it, only correctness is kept).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import ctypes.util
import functools
import logging
import mmap as _mmap
import sys
from typing import Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

__all__ = ["MappedFile", "attach_mapping", "mapped_file_of", "release_after_forward", "trim_heap"]

log = logging.getLogger(__name__)

_MADV_DONTNEED = 4  # <sys/mman.h> on Linux
# /proc/self/pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst)
_PRESENT, _SWAPPED, _FILE = np.uint64(1 << 63), np.uint64(1 << 62), np.uint64(1 << 61)
ATTRIBUTE = "ptq_mapped_file"  # set on a model whose weights live in a mapping


@functools.lru_cache(maxsize=1)
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:  # pragma: no cover - no libc
        return None
    fn = libc.madvise
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


class MappedFile:
    """The storages of a ``torch.load(mmap=True)`` result; holding them keeps their mapping valid."""

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        spans = {}
        for t in tensors:
            if torch.is_tensor(t) and t.device.type == "cpu" and t.untyped_storage().nbytes():
                storage = t.untyped_storage()
                spans[storage.data_ptr()] = (storage.data_ptr() + storage.nbytes(), t)
        if not spans:
            raise ValueError("no CPU tensors to record a mapping from")
        self._starts = sorted(spans)
        self._ends = [spans[s][0] for s in self._starts]
        self.anchors = [spans[s][1] for s in self._starts]  # views only: they keep the mapping, not its pages
        self.released_bytes = 0
        self._trim_floor = resident_bytes()

    def contains(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage is one of the recorded (file-mapped) storages or inside one."""
        if tensor.device.type != "cpu":
            return False
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        i = bisect.bisect_right(self._starts, ptr) - 1
        return i >= 0 and ptr + storage.nbytes() <= self._ends[i]

    def release(self, tensors: Iterable[torch.Tensor]) -> int:
        """Drop the file's pages wholly inside each mapped tensor's storage; returns bytes released.

        Pages written since loading are kept (see the module docstring).
        """
        fn = _madvise()
        if fn is None:
            return 0
        page = _mmap.PAGESIZE
        total = 0
        for tensor in tensors:
            if not self.contains(tensor):
                continue
            storage = tensor.untyped_storage()
            lo = -(-storage.data_ptr() // page) * page
            hi = (storage.data_ptr() + storage.nbytes()) // page * page
            for start, stop in unwritten_runs(lo, hi):
                if fn(start, stop - start, _MADV_DONTNEED) == 0:
                    total += stop - start
        self.released_bytes += total
        self._trim_if_grown()
        return total

    def _trim_if_grown(self) -> None:
        """Trim glibc's heap once resident memory grew by :data:`TRIM_GROWTH` since the last trim.

        Freed activations of a deep forward (ESMFold's 48 trunk blocks) and the float
        temporaries of weight rounding stay in fragmented heap instead of going back to
        the OS: the ESMFold-sized trunk's calibration reached 4.9x its checkpoint's size
        without trims (BENCHMARKS.md, issue 13). A trim costs page faults later, so it
        runs on growth, not on every release.
        """
        if resident_bytes() > self._trim_floor + TRIM_GROWTH:
            trim_heap()
            self._trim_floor = resident_bytes()


def unwritten_runs(lo: int, hi: int) -> List[Tuple[int, int]]:
    """The address ranges in the page-aligned ``[lo, hi)`` whose pages hold the file's bytes, not an edit.

    A page of a private file mapping that was written is anonymous memory: present
    without the file bit, or swapped out. Every other page (resident from the file,
    or never touched) can be dropped and read back unchanged. [] where the page
    map cannot be read: then nothing is provably safe to drop.
    """
    page = _mmap.PAGESIZE
    if hi <= lo:
        return []
    try:
        with open("/proc/self/pagemap", "rb") as handle:
            handle.seek(lo // page * 8)
            raw = handle.read((hi - lo) // page * 8)
    except OSError:
        return []
    flags = np.frombuffer(raw, dtype=np.uint64)
    if len(flags) != (hi - lo) // page:
        return []
    written = ((flags & _PRESENT != 0) & (flags & _FILE == 0)) | (flags & _SWAPPED != 0)
    edges = np.flatnonzero(np.diff(np.concatenate(([True], written, [True])).astype(np.int8)))
    return [(lo + int(a) * page, lo + int(b) * page) for a, b in zip(edges[::2], edges[1::2])]


def attach_mapping(model: nn.Module, tensors: Iterable[torch.Tensor]) -> None:
    """Record on ``model`` the mapping its weights (some of ``tensors``) come from."""
    try:
        object.__setattr__(model, ATTRIBUTE, MappedFile(tensors))
    except ValueError:  # nothing mapped (an empty or GPU state): nothing to release later
        pass


def mapped_file_of(model: nn.Module) -> Optional[MappedFile]:
    """The :class:`MappedFile` a loader attached to ``model``, or None."""
    found = getattr(model, ATTRIBUTE, None)
    return found if isinstance(found, MappedFile) else None


@contextlib.contextmanager
def release_after_forward(model: nn.Module, mapped: Optional[MappedFile]) -> Iterator[None]:
    """While active, each leaf module's mapped parameters are released after its forward.

    Leaves only, so a parent never releases weights a later child still needs
    within the same call; the pages come back from the page cache on the next call.
    """
    if mapped is None:
        yield
        return
    handles = []
    try:
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if mapped.contains(p)]
            if own and not any(True for _ in module.children()):
                handles.append(module.register_forward_hook(_releaser(mapped, own)))
        yield
    finally:
        for handle in handles:
            handle.remove()


# Resident growth (bytes) since the last heap trim that triggers the next one (see MappedFile._trim_if_grown).
TRIM_GROWTH = 128 * 2**20


def _releaser(mapped: MappedFile, params):
    def hook(module, args, output):
        mapped.release(params)
        return None  # a forward hook's return value would replace the output

    return hook


def resident_bytes() -> int:
    """This process's resident set size (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return 0


def trim_heap() -> None:
    """Ask glibc to return freed heap memory to the OS (``malloc_trim(0)``); no-op elsewhere.

    Freed float layers smaller than glibc's (self-raising) mmap threshold stay in the
    heap between live int8 codes and would otherwise keep counting as resident.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass
