"""Weights read from a memory-mapped checkpoint, and handing their pages back to the OS.

``torch.load(mmap=True)`` (and ``pp.load(mapped=True)`` for an artifact's tensor
file, :func:`ptq_protein.artifact.tensors.map_tensors`) maps the file privately: a tensor's bytes are read
from disk (or the OS page cache) when first touched and then count in the
process's resident memory for as long as the mapping lives, even once every
layer that used them has been quantized. :class:`MappedFile` records the
address range of one such mapping; :meth:`MappedFile.release` tells the kernel
(``madvise(MADV_DONTNEED)``) that the pages of some tensors are not needed now.
For a private file mapping that was never written, that is lossless: the pages
stay in the page cache (reclaimable, not this process's memory) and are mapped
again on the next touch. So a model whose weights live in a mapping can
calibrate and quantize with about one layer's float weights resident, and fold
with about one trunk block's (a page fault from the page cache costs far less
than the block's products).

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
import os
import sys
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

__all__ = ["MappedFile", "attach_mapping", "mapped_file_of", "release_after_forward", "tensor_span", "trim_heap"]

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
        """Drop the file's pages wholly inside each mapped tensor's bytes; returns bytes released.

        A tensor's own bytes, not its storage's: many tensors can be views of one mapping
        (an artifact's tensor file), and a page shared with a neighbour is kept. Pages written
        since loading are kept (see the module docstring).
        """
        return self._release_spans(_merged(tensor_span(t) for t in tensors if self.contains(t)))

    def release_one(self, tensor: torch.Tensor) -> int:
        """:meth:`release` of one tensor: the hook a check calls once it has read that tensor."""
        return self.release([tensor])

    def release_all(self) -> int:
        """Drop every unwritten page of the recorded storages (after a pass that read them all: a check, a cast)."""
        return self._release_spans(list(zip(self._starts, self._ends)))

    def _release_spans(self, spans: List[Tuple[int, int]]) -> int:
        fn = _madvise()
        if fn is None:
            return 0
        page = _mmap.PAGESIZE
        total = 0
        for start, stop in spans:
            lo = -(-start // page) * page
            hi = stop // page * page
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


def _merged(spans: Iterable[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Byte ranges joined where they touch or overlap: adjacent tensors of a file release as one range (and the
    page they share goes too, both being released)."""
    out: List[Tuple[int, int]] = []
    for start, stop in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def tensor_span(tensor: torch.Tensor) -> Tuple[int, int]:
    """The address range ``[start, stop)`` that ``tensor``'s elements occupy (any strides; empty: start == stop)."""
    start = tensor.data_ptr()
    if tensor.numel() == 0:
        return start, start
    extent = 1 + sum((size - 1) * abs(step) for size, step in zip(tensor.shape, tensor.stride()))
    low = sum((size - 1) * step for size, step in zip(tensor.shape, tensor.stride()) if step < 0)
    return start + low * tensor.element_size(), start + (low + extent) * tensor.element_size()


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
    raw = _read_proc("pagemap", lo // page * 8, (hi - lo) // page * 8)
    if raw is None:
        return []
    flags = np.frombuffer(raw, dtype=np.uint64)
    if len(flags) != (hi - lo) // page:
        return []
    written = ((flags & _PRESENT != 0) & (flags & _FILE == 0)) | (flags & _SWAPPED != 0)
    edges = np.flatnonzero(np.diff(np.concatenate(([True], written, [True])).astype(np.int8)))
    return [(lo + int(a) * page, lo + int(b) * page) for a, b in zip(edges[::2], edges[1::2])]


def attach_mapping(model: nn.Module, tensors: Union[MappedFile, Iterable[torch.Tensor]]) -> None:
    """Record on ``model`` the mapping its weights (some of ``tensors``, or a :class:`MappedFile`) come from."""
    try:
        object.__setattr__(model, ATTRIBUTE, tensors if isinstance(tensors, MappedFile) else MappedFile(tensors))
    except ValueError:  # nothing mapped (an empty or GPU state): nothing to release later
        pass


def mapped_file_of(model: nn.Module) -> Optional[MappedFile]:
    """The :class:`MappedFile` a loader attached to ``model``, or None."""
    found = getattr(model, ATTRIBUTE, None)
    return found if isinstance(found, MappedFile) else None


@contextlib.contextmanager
def release_after_forward(model: nn.Module, mapped: Optional[MappedFile],
                          units: Optional[Sequence[nn.Module]] = None) -> Iterator[None]:
    """While active, mapped weights are released after the forward that used them.

    By default each leaf module's mapped parameters, after the leaf's forward (leaves only, so
    a parent never releases weights a later child still needs within the same call). ``units``:
    instead, each of these modules' mapped parameters and buffers after the unit's forward, for
    modules that run once per pass (an ESMFold's stem layers and trunk blocks): one release a
    unit, and the modules outside them (a structure module that runs its layer in a loop) keep
    theirs. The pages come back from the page cache on the next call.
    """
    if mapped is None:
        yield
        return
    handles = []
    try:
        if units is None:
            for module in model.modules():
                own = [p for p in module.parameters(recurse=False) if mapped.contains(p)]
                if own and not any(True for _ in module.children()):
                    handles.append(module.register_forward_hook(_releaser(mapped, own)))
        else:
            for unit in units:
                own = [t for t in [*unit.parameters(), *unit.buffers()] if mapped.contains(t)]
                if own:
                    handles.append(unit.register_forward_hook(_releaser(mapped, own)))
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
    raw = _read_proc("statm", 0, 4096)
    try:
        return int(raw.split()[1]) * _mmap.PAGESIZE if raw else 0
    except (ValueError, IndexError):
        return 0


_PROC_FILES: dict = {}  # name -> (pid that opened it, descriptor)


def _read_proc(name: str, offset: int, size: int) -> Optional[bytes]:
    """``size`` bytes at ``offset`` of ``/proc/self/<name>`` (None where it cannot be read).

    A fold releases pages after every layer's forward, thousands of times: the file is opened once
    per process (reopened in a forked child, whose ``self`` is another process).
    """
    pid = os.getpid()
    held = _PROC_FILES.get(name)
    try:
        if held is None or held[0] != pid:
            held = _PROC_FILES[name] = (pid, os.open(f"/proc/self/{name}", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        return os.pread(held[1], size, offset)
    except OSError:
        return None


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
