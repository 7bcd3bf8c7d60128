"""Optional Triton import and the autotune tables shared by every kernel file.

Triton is optional: without it the kernel modules still import (the ``@jit``
bodies stay plain, never-called Python functions) and every wrapper serves
the exact torch reference instead. ``TRITON_INTERPRET=1`` must be set before
the first kernel module is imported, because ``triton.jit`` decides between
the compiler and the CPU interpreter when it decorates.

Autotuning is Triton's own ``triton.autotune`` over a short literal list of
configurations per architecture (Hopper, Ampere, interpreter), built on first
use so nothing GPU-related happens at import time. Each configuration is timed
for about 25 ms (not Triton's default 100 ms: a GEMM of interest runs for
0.01-1 ms, so that is still tens of repetitions), and the winners are cached
on disk by Triton (``cache_results``), so a new process does not re-tune.
"""

from __future__ import annotations

import functools
import inspect
import os
import types
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

try:  # pragma: no cover - exercised implicitly by every import
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CI image has triton
    triton = None
    # Stand-in so that ``BLOCK: tl.constexpr`` annotations and constexpr globals still evaluate.
    tl = types.SimpleNamespace(constexpr=lambda value=None: value)

__all__ = [
    "HAS_TRITON",
    "ConfigTable",
    "device_arch",
    "interpreting",
    "jit",
    "tl",
    "triton",
    "tuned_kernel",
]

HAS_TRITON = triton is not None
# Autotuning benchmark per configuration, in ms (triton.testing.do_bench warmup / rep).
_TUNE_WARMUP_MS = 5
_TUNE_REP_MS = 25

_TRUE_WORDS = ("1", "true", "yes", "on")


def jit(fn: Callable) -> Callable:
    """``triton.jit`` when Triton is installed; the plain function otherwise."""
    return triton.jit(fn) if HAS_TRITON else fn


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    if not HAS_TRITON:
        return False
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "").lower() in _TRUE_WORDS


@dataclass(frozen=True)
class ConfigTable:
    """Literal autotune configurations of one kernel, per architecture.

    Each row is ``(*values of names, num_warps, num_stages)``. ``hopper``
    serves compute capability 9.x and newer, ``ampere`` 8.x (and anything
    older that still runs Triton), ``interpreter`` the CPU interpreter: one
    small row so the tests stay fast.
    """

    names: tuple[str, ...]
    hopper: tuple[tuple[int, ...], ...]
    ampere: tuple[tuple[int, ...], ...]
    interpreter: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        width = len(self.names) + 2
        for arch in ("hopper", "ampere", "interpreter"):
            rows = getattr(self, arch)
            if not rows or any(len(row) != width for row in rows):
                raise ValueError(f"ConfigTable.{arch}: every row needs {width} values (names + num_warps, num_stages)")

    def rows(self, arch: str) -> tuple[tuple[int, ...], ...]:
        """Rows for ``arch`` in ``{"hopper", "ampere", "interpreter"}``."""
        return getattr(self, arch)


def device_arch(device: torch.device) -> str:
    """Which :class:`ConfigTable` column serves ``device``."""
    if interpreting() or device.type != "cuda":
        return "interpreter"
    major, _minor = torch.cuda.get_device_capability(device)
    return "hopper" if major >= 9 else "ampere"


def tuned_kernel(kernel: Callable, table: ConfigTable, key: Sequence[str], device: torch.device) -> Callable:
    """``triton.autotune`` of ``kernel`` over ``table``'s rows for ``device``, cached."""
    return _tuned(kernel, table, tuple(key), device_arch(device))


@functools.lru_cache(maxsize=None)
def _tuned(kernel: Callable, table: ConfigTable, key: tuple[str, ...], arch: str) -> Callable:
    configs = [
        triton.Config(dict(zip(table.names, row[:-2])), num_warps=row[-2], num_stages=row[-1])
        for row in table.rows(arch)
    ]
    options = inspect.signature(triton.autotune).parameters  # both options are recent (Triton 3.x)
    extra = {"do_bench": _tuning_bench} if "do_bench" in options else {}
    if "cache_results" in options:
        extra["cache_results"] = True
    return triton.autotune(configs=configs, key=list(key), **extra)(kernel)


def _tuning_bench(kernel_call: Callable[[], None], quantiles: Sequence[float]):
    """The autotuner's timing of one configuration (shorter than Triton's default)."""
    return triton.testing.do_bench(kernel_call, warmup=_TUNE_WARMUP_MS, rep=_TUNE_REP_MS, quantiles=quantiles)
