"""An honest up-front memory check: refuse a quantize run that cannot fit, before loading.

The estimate (bytes) is built from what was measured in BENCHMARKS.md (issue 13):

* a fixed runtime: Python, torch, fair-esm/transformers and the compiled
  quantizers (``RUNTIME_BYTES``);
* the weights: in the default mode the float checkpoint (its file size; the
  CLI maps it, and pages come and go through the page cache, but a machine
  without that much memory thrashes) plus the int8 codes (a quarter of the
  float32 bytes); in ``low_memory`` mode only the int8 codes plus one float
  layer;
* the calibration activations of one batch: the model's width is not known
  before loading, so a conservative per-token figure
  (``ACTIVATION_BYTES_PER_TOKEN_PER_GB``) is scaled by the checkpoint size.

It is an estimate, printed with one significant figure and never used to
change results: when only the streaming mode fits, ``quantize`` switches to it
(:func:`choose_low_memory`), whose artifact equals the default mode's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

from ptq_protein.support.env_settings import SKIP_MEMORY_CHECK
from ptq_protein.support.errors import InputError
from ptq_protein.support.io_utils import env_flag

__all__ = ["MemoryEstimate", "estimate_quantize_memory", "available_memory_bytes", "resident_bytes", "shortfall",
           "check_fits",
           "choose_low_memory", "process_budget", "DEFAULT_SHARE"]

log = logging.getLogger(__name__)

RUNTIME_BYTES = 600 * 2 ** 20  # measured: ~220 MB torch import, ~300 MB with the toolkit, + compiled loops
INT8_FRACTION = 0.25  # int8 codes per float32 byte
LOW_MEMORY_LAYER_FRACTION = 0.1  # the largest single layer plus slack, as a fraction of the file
ACTIVATION_BYTES_PER_TOKEN_PER_GB = 64 * 2 ** 10  # transient activations per token in flight, per GB of weights
# A recipe with GPTQ (ESM-2's default) in the default mode: measured peak 2.75x the float checkpoint at 650M (7.2 GB
# for 2.6 GB; w8a8-pwlq 0.47x), so the weights term carries 1.6x the checkpoint more (2.85x in all).
GPTQ_FRACTION = 1.6


@dataclass(frozen=True)
class MemoryEstimate:
    """What a run is expected to need, in bytes, and from what."""

    weights_bytes: int
    needed_bytes: int
    low_memory: bool

    def __post_init__(self) -> None:
        if self.weights_bytes < 0 or self.needed_bytes < 0:
            raise ValueError("memory estimates are non-negative byte counts")


def estimate_quantize_memory(weights_bytes: int, *, low_memory: bool, calibration_tokens: int,
                             gptq: bool = False) -> MemoryEstimate:
    """Bytes a ``quantize`` run needs for a float32 checkpoint of ``weights_bytes``.

    ``calibration_tokens``: tokens in one calibration batch (batch size x longest sequence); ``gptq``: the recipe
    runs GPTQ (the default mode only: ``low_memory`` streams recipes without it).
    """
    if low_memory:
        weights = weights_bytes * (INT8_FRACTION + LOW_MEMORY_LAYER_FRACTION)
    else:
        weights = weights_bytes * (1 + INT8_FRACTION + (GPTQ_FRACTION if gptq else 0.0))
    activations = calibration_tokens * ACTIVATION_BYTES_PER_TOKEN_PER_GB * max(weights_bytes / 2 ** 30, 0.1)
    return MemoryEstimate(int(weights_bytes), int(RUNTIME_BYTES + weights + activations), low_memory)


DEFAULT_SHARE = 0.9  # of MemAvailable, without --max-memory: headroom for a prediction's error


def process_budget(max_memory: Optional[int] = None) -> Optional[int]:
    """Bytes a run's process may use: ``max_memory``, else its resident bytes + 90% of ``MemAvailable``.

    None (no check): unknown, or ``PTQ_PROTEIN_SKIP_MEMORY_CHECK=1`` and no ``max_memory``.
    """
    if max_memory is not None:
        if max_memory <= 0:
            raise InputError(f"max_memory={max_memory}: give a positive size, e.g. 16G")
        return int(max_memory)
    if env_flag(SKIP_MEMORY_CHECK):
        return None
    available = available_memory_bytes()
    return None if available is None else int(DEFAULT_SHARE * available) + resident_bytes()


def available_memory_bytes() -> Optional[int]:
    """``MemAvailable`` from /proc/meminfo (Linux), else None (no check is made)."""
    return _proc_bytes("/proc/meminfo", "MemAvailable:")


def resident_bytes() -> int:
    """This process's resident memory (``VmRSS``, Linux), else 0."""
    return _proc_bytes("/proc/self/status", "VmRSS:") or 0


def _proc_bytes(path: str, key: str) -> Optional[int]:
    """The ``key: N kB`` line of a /proc file, in bytes; None when unreadable."""
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def shortfall(weights_path: Optional[Path], *, low_memory: bool, calibration_tokens: int, gptq: bool = False
              ) -> Optional[Tuple[MemoryEstimate, int]]:
    """``(estimate, available bytes)`` when the run would not fit; None when it fits or nothing can be checked."""
    if weights_path is None or env_flag(SKIP_MEMORY_CHECK):
        return None
    path = Path(weights_path)
    size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    estimate = estimate_quantize_memory(size, low_memory=low_memory, calibration_tokens=calibration_tokens, gptq=gptq)
    available = available_memory_bytes()
    if available is not None and estimate.needed_bytes > available:
        return estimate, available
    return None


def check_fits(weights_path: Optional[Path], *, low_memory: bool, calibration_tokens: int) -> None:
    """Raise :class:`InputError` (one line) when the run cannot fit."""
    short = shortfall(weights_path, low_memory=low_memory, calibration_tokens=calibration_tokens)
    if short is not None:
        _refuse(short, "free memory or use a machine with more" if low_memory else "try --low-memory")


def choose_low_memory(weights_path: Optional[Path], *, asked: bool, calibration_tokens: int,
                      stream_refusal: Optional[str], gptq: bool = False) -> bool:
    """Whether to stream layer by layer: asked for, or the default mode would not fit and streaming would.

    ``stream_refusal`` says why this run cannot stream (None: it can); ``gptq``: the default mode's recipe runs
    GPTQ. Raises :class:`InputError` (one line) when neither mode fits. Switching is logged: for a streamable
    recipe the streamed run makes the default mode's artifact (BENCHMARKS.md, issue 13).
    """
    if asked:
        check_fits(weights_path, low_memory=True, calibration_tokens=calibration_tokens)
        return True
    short = shortfall(weights_path, low_memory=False, calibration_tokens=calibration_tokens, gptq=gptq)
    if short is None:
        return False
    if stream_refusal is not None:
        _refuse(short, f"--low-memory would need less, but {stream_refusal}")
    low = shortfall(weights_path, low_memory=True, calibration_tokens=calibration_tokens)
    if low is not None:
        _refuse(short, f"~{_gb(low[0].needed_bytes)} GB even layer by layer (--low-memory): free memory or use a "
                       "machine with more")
    log.warning("the default mode needs ~%s GB and this machine has %s GB available: quantizing layer by layer "
                "instead (--low-memory: a streamable recipe's artifact is the default mode's)",
                _gb(short[0].needed_bytes), _gb(short[1]))
    return True


def _refuse(short: Tuple[MemoryEstimate, int], hint: str) -> None:
    estimate, available = short
    raise InputError(f"needs ~{_gb(estimate.needed_bytes)} GB, this machine has {_gb(available)} GB available; "
                     f"{hint} (PTQ_PROTEIN_SKIP_MEMORY_CHECK=1 skips this check)")


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f}"
