"""Give freed memory back to the system (glibc), so a long run's resident size is what it holds, not its past.

glibc serves a large block by ``mmap`` and returns it on ``free``, but after such a free it raises its
threshold (up to 32 MiB): later blocks of that size come from the heap, which keeps their pages after
``free``. Loading a quantized model frees many weight-sized temporaries (the float weights it replaces,
the codes it prepacks), so a loaded ESM-2 650M int8 artifact sat at 2.8 GiB resident after one forward
while it held 0.9 GiB; with the threshold fixed, 1.0 GiB (docs/benchmarks-history.md, 2026-12-04). Both calls are
no-ops off glibc (macOS, Windows, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Optional

__all__ = ["return_large_blocks", "release_freed_memory"]

_M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)
_THRESHOLD = 128 * 1024  # glibc's initial threshold, kept fixed
_ENV = "MALLOC_MMAP_THRESHOLD_"  # a user's own setting wins


@functools.lru_cache(maxsize=None)
def _glibc() -> Optional[ctypes.CDLL]:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def return_large_blocks() -> bool:
    """Keep glibc's mmap threshold at 128 KiB for this process (freed large blocks go back at once).

    For processes this package runs (the CLI); a library call leaves the caller's allocator alone and uses
    :func:`release_freed_memory` instead. True when set.
    """
    libc = _glibc()
    if libc is None or os.environ.get(_ENV):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _THRESHOLD))


def release_freed_memory() -> bool:
    """Return the heap's free pages to the system now (``malloc_trim(0)``); True when any were returned."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
