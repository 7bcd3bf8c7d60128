"""How far each embed-bench row's saved mean vectors are from fair-esm's loop in FP32.

``mean-vector error``: ||M - M_fp||_F / ||M_fp||_F over the per-sequence mean vectors (M: one row per sequence).
A few huge channels (planted residual outliers, LayerNorm gains) dominate that norm and can hide a large error in
every other channel, so ``standardized error`` is the same norm after each channel is standardized by the
reference's mean and standard deviation over sequences (what a downstream model sees after scikit-learn's
``StandardScaler``, fitted on the reference): every channel counts alike and none can dominate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

import torch

from bench.process_rows import RowResult

REFERENCE = "fair"  # the row every error is read against: fair-esm's extract.py loop, FP32


@dataclass(frozen=True)
class RowError:
    """One row's errors against the reference (relative; None where the row saved other labels)."""

    mean: float
    standardized: float


def mean_vectors(folder: Path) -> Dict[str, torch.Tensor]:
    """{label: mean vector} of every ``LABEL.pt`` (extract.py's format) under ``folder``."""
    found = {}
    for path in folder.rglob("*.pt"):
        data = torch.load(path, weights_only=True)
        found[data["label"]] = next(iter(data["mean_representations"].values())).float()
    return found


def relative_error(reference: torch.Tensor, other: torch.Tensor) -> float:
    """||other - reference||_F / ||reference||_F in float64 (both shape (N, D))."""
    a, b = reference.double(), other.double()
    return float((b - a).norm() / a.norm())


def standardized_error(reference: torch.Tensor, other: torch.Tensor) -> float:
    """:func:`relative_error` after standardizing each channel by the reference's mean and population standard
    deviation over the N rows (shapes (N, D)); a constant channel keeps scale 1 (``StandardScaler``'s rule). NaN
    when the standardized reference is all zero (N = 1)."""
    a, b = reference.double(), other.double()
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(f"standardized_error needs two (N, D) matrices, got {tuple(a.shape)} and {tuple(b.shape)}")
    mean, std = a.mean(dim=0), a.std(dim=0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    za = (a - mean) / std
    norm = za.norm()
    return float(((b - a) / std).norm() / norm) if norm > 0 else float("nan")


def row_errors(results: Mapping[str, RowResult]) -> Dict[str, Optional[RowError]]:
    """Every row's :class:`RowError` against :data:`REFERENCE`'s files (None: not run, or other labels)."""
    ref = results.get(REFERENCE)
    reference = mean_vectors(ref.out) if ref is not None and ref.ok else {}
    return {key: _errors(reference, r.out) if reference and r.ok else None for key, r in results.items()}


def _errors(reference: Mapping[str, torch.Tensor], folder: Path) -> Optional[RowError]:
    stacked = _stacked(reference, mean_vectors(folder))
    return None if stacked is None else RowError(relative_error(*stacked), standardized_error(*stacked))


def _stacked(reference: Mapping[str, torch.Tensor],
             have: Mapping[str, torch.Tensor]) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    if set(have) != set(reference):
        return None
    labels = sorted(reference)
    return torch.stack([reference[k] for k in labels]), torch.stack([have[k] for k in labels])
