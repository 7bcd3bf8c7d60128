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
change results.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ptq_protein.errors import InputError

__all__ = ["MemoryEstimate", "estimate_quantize_memory", "available_memory_bytes", "check_fits"]

RUNTIME_BYTES = 600 * 2 ** 20  # measured: ~220 MB torch import, ~300 MB with the toolkit, + compiled loops
INT8_FRACTION = 0.25  # int8 codes per float32 byte
LOW_MEMORY_LAYER_FRACTION = 0.1  # the largest single layer plus slack, as a fraction of the file
ACTIVATION_BYTES_PER_TOKEN_PER_GB = 64 * 2 ** 10  # transient activations per token in flight, per GB of weights


@dataclass(frozen=True)
class MemoryEstimate:
    """What a run is expected to need, in bytes, and from what."""

    weights_bytes: int
    needed_bytes: int
    low_memory: bool

    def __post_init__(self) -> None:
        if self.weights_bytes < 0 or self.needed_bytes < 0:
            raise ValueError("memory estimates are non-negative byte counts")


def estimate_quantize_memory(weights_bytes: int, *, low_memory: bool, calibration_tokens: int) -> MemoryEstimate:
    """Bytes a ``quantize`` run needs for a float32 checkpoint of ``weights_bytes``.

    ``calibration_tokens``: tokens in one calibration batch (batch size x longest sequence).
    """
    if low_memory:
        weights = weights_bytes * (INT8_FRACTION + LOW_MEMORY_LAYER_FRACTION)
    else:
        weights = weights_bytes * (1 + INT8_FRACTION)
    activations = calibration_tokens * ACTIVATION_BYTES_PER_TOKEN_PER_GB * max(weights_bytes / 2 ** 30, 0.1)
    return MemoryEstimate(int(weights_bytes), int(RUNTIME_BYTES + weights + activations), low_memory)


def available_memory_bytes() -> Optional[int]:
    """``MemAvailable`` from /proc/meminfo (Linux), else None (no check is made)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(weights_path: Optional[Path], *, low_memory: bool, calibration_tokens: int) -> Optional[MemoryEstimate]:
    """Raise :class:`InputError` when the run cannot fit; None when there is nothing to check."""
    if weights_path is None or os.environ.get("PTQ_PROTEIN_SKIP_MEMORY_CHECK"):
        return None
    path = Path(weights_path)
    size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    estimate = estimate_quantize_memory(size, low_memory=low_memory, calibration_tokens=calibration_tokens)
    available = available_memory_bytes()
    if available is not None and estimate.needed_bytes > available:
        hint = "free memory or use a machine with more" if low_memory else "try --low-memory"
        raise InputError(f"needs ~{_gb(estimate.needed_bytes)} GB, this machine has {_gb(available)} GB available; "
                         f"{hint} (PTQ_PROTEIN_SKIP_MEMORY_CHECK=1 skips this check)")
    return estimate


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f}"
