"""Spearman's rank correlation of two score vectors, the measure of variant-effect predictions (ProteinGym).

A thin layer over ``scipy.stats.spearmanr`` (average ranks for ties): pairs where
either value is missing (NaN) are dropped, and an undefined correlation (fewer
than :data:`MIN_PAIRS` pairs, or a constant side) is NaN instead of a warning.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np

__all__ = ["spearman", "MIN_PAIRS"]

MIN_PAIRS = 3  # two points always correlate perfectly: no information


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho of ``x`` [N] and ``y`` [N] over the pairs where both are finite; NaN when undefined.

    >>> round(spearman([1, 2, 3, 4], [10, 20, 30, 5]), 6)
    -0.2
    """
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"spearman needs two 1-D arrays of one length, got shapes {a.shape} and {b.shape}")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if a.size < MIN_PAIRS or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(spearmanr(a, b)[0])  # [0]: the statistic in every scipy >= 1.9
