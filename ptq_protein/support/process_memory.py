"""How this process's heap (glibc) treats freed memory: returned while loading, kept for reuse while computing.

Two phases want opposite things:

* **Loading** frees weight-sized temporaries (the float weights a quantized model replaces, the plain codes it
  prepacks). glibc serves a large block by ``mmap`` and returns it on ``free``, but after such a free it raises
  its threshold (up to 32 MiB), so later blocks of that size come from the heap and keep their pages: a loaded
  ESM-2 650M int8 artifact sat at 2.8 GiB resident after one forward while it held 0.9 GiB. With the threshold
  fixed at 128 KiB while loading, and the heap trimmed after it, 1.0 GiB.
* **Computing** allocates and frees the same activation-sized blocks in every layer of every batch. Served by
  ``mmap``, each one is a fresh mapping the kernel zero-fills page by page and unmaps on ``free``: with the
  threshold fixed at 128 KiB, an int8 ``embed`` of 120 sequences took 9.4 million page faults and 40% of its
  wall time in the kernel. Kept in the heap, the blocks of one batch serve the next.

So loading a model (:func:`loading`, around ``pp.load``, ``load_model`` and ``pp.quantize``) fixes the threshold
while it runs, then trims the heap and keeps freed blocks below :data:`KEEP_BELOW` for reuse, in the CLI and in a
library caller's process alike (the library path runs as fast as the command). The resident size then follows the
largest batch's working set, which the batch plan keeps within the memory budget (``fold``'s and ``embed``'s
checks). A CLI command restores glibc's threshold when it ends (:func:`managed_heap`). Measurements:
docs/benchmarks-history.md. Every call is a no-op off glibc (macOS, Windows, musl), and a user's own
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` / ``GLIBC_TUNABLES`` wins.

The forwards inside a load (``pp.quantize``'s calibration, SmoothQuant's ranges, GPTQ's Hessians) and a streamed
quantize's layers are computing: :func:`computing` keeps their blocks for reuse while they run (a 35M-sized GPTQ
quantize spent 30 of its 84 s in the kernel without it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
from typing import Iterator, Optional

__all__ = ["managed_heap", "loading", "computing", "release_freed_memory", "return_large_blocks", "KEEP_BELOW",
           "KEEP_FREE"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_RETURN_ABOVE = 128 * 1024  # glibc's initial mmap threshold, kept fixed while loading
# While computing: blocks below 64 MiB (an ESM-2 650M layer's largest float32 activation at 4096 tokens is 63 MB)
# come from the heap, and up to 256 MiB of its free top stay. Measured on a 35M-sized int8 embed of 120 sequences:
# 3.1 million page faults and 6.1 s in the kernel with blocks returned, 0.14 million and 0.44 s with these; peak
# resident 457 -> 550 MB, where keeping every block below 1 GiB gave 578 MB (docs/benchmarks-history.md).
KEEP_BELOW = 64 << 20
KEEP_FREE = 256 << 20
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
_managed = False  # inside managed_heap(): a CLI command
_depth = 0  # nested loading() blocks (a quantize that loads a model): the outermost one ends the phase
_keeping = False  # the last setting made here: freed blocks kept for reuse (True) or returned at once


@functools.lru_cache(maxsize=None)
def _glibc() -> Optional[ctypes.CDLL]:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def _tunable() -> Optional[ctypes.CDLL]:
    """glibc, unless the user set its malloc thresholds themselves (their setting wins)."""
    return None if any(os.environ.get(v) for v in _USER_SETTINGS) else _glibc()


@contextlib.contextmanager
def managed_heap() -> Iterator[bool]:
    """A CLI command's heap: freed large blocks go back at once until a model has loaded (:func:`loading` then
    keeps them for reuse), and again after the block (a test or a caller running several commands in one process
    keeps no command's heap). Yields whether glibc's settings are this package's to change."""
    global _managed
    _managed = return_large_blocks()
    try:
        yield _managed
    finally:
        if _managed:
            _managed = False
            libc = _tunable()
            if libc is not None:
                libc.mallopt(_M_TRIM_THRESHOLD, _RETURN_ABOVE)
            return_large_blocks()
            release_freed_memory()


def return_large_blocks() -> bool:
    """Fix glibc's mmap threshold at 128 KiB: freed blocks above it go back to the system at once."""
    global _keeping
    libc = _tunable()
    done = libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, _RETURN_ABOVE))
    _keeping = _keeping and not done
    return done


def _keep_freed_blocks() -> bool:
    """Serve blocks below :data:`KEEP_BELOW` from the heap, and keep up to :data:`KEEP_FREE` of its free top:
    the next batch reuses them instead of faulting fresh pages in."""
    global _keeping
    libc = _tunable()
    _keeping = libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BELOW)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, KEEP_FREE))
    return _keeping


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Around building or loading a model: its freed temporaries go back to the system, the heap is trimmed
    after, and (in a managed process) freed blocks are kept for the forwards that follow."""
    global _depth
    if _depth == 0:
        return_large_blocks()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            release_freed_memory()
            _keep_freed_blocks()


@contextlib.contextmanager
def computing() -> Iterator[None]:
    """Forwards run while freed blocks are returned (inside :func:`loading`: a quantize's calibration; a streamed
    quantize's layers): their freed activation-sized blocks are kept for the next batch while the block runs;
    after it, freed blocks go back at once again and the heap is trimmed. Where blocks are kept already, or the
    settings are not this package's, nothing changes."""
    if _keeping or not _keep_freed_blocks():
        yield
        return
    try:
        yield
    finally:
        return_large_blocks()
        release_freed_memory()


def release_freed_memory() -> bool:
    """Return the heap's free pages to the system now (``malloc_trim(0)``); True when any were returned."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
