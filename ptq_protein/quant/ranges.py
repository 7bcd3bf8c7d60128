"""Range choosers on top of the observers: min-max, top-k median, percentile, MSE.

Each returns a clipping range ``(lo, hi)`` to feed
:func:`ptq_protein.quant.uniform.choose_qparams` (or a PWLQ builder).
``symmetric=True`` returns ``(-a, a)`` with ``a = max(-lo, hi)``, as the study
does before symmetric quantization. The MSE search scores candidates with the
exact histogram error of the real quantizer (float32 scale, rounded zero point).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ptq_protein.quant.breakpoint_search import PwlqSearchResult, search_pwlq, uniform_levels
from ptq_protein.quant.histogram import HistogramObserver, expected_sq_error
from ptq_protein.quant.observers import MinMaxObserver, TopKObserver
from ptq_protein.quant.stats import MomentsObserver

__all__ = [
    "DEFAULT_PERCENTILE",
    "UniformRangeResult",
    "minmax_range",
    "topk_range",
    "percentile_range",
    "mse_uniform_range",
    "pwlq_search_range",
]

DEFAULT_PERCENTILE = 99.99


@dataclass(frozen=True)
class UniformRangeResult:
    """Best uniform clipping range and its expected MSE, with the min-max range's MSE."""

    lo: float
    hi: float
    mse: float
    minmax_mse: float


def minmax_range(obs: MinMaxObserver | MomentsObserver, symmetric: bool = False):
    """Observed ``(min, max)`` (float64 tensors, per channel if the observer is)."""
    if obs.min_val is None:
        raise ValueError(f"{type(obs).__name__} has seen no values: run calibration data through the site")
    lo, hi = obs.min_val, obs.max_val
    return _symmetrize(lo, hi) if symmetric else (lo, hi)


def topk_range(obs: TopKObserver, symmetric: bool = False):
    """Top-k median bounds of our masked, sampled statistic (see :class:`TopKObserver`; not the study's feed)."""
    lo, hi = obs.compute()
    return _symmetrize(lo, hi) if symmetric else (lo, hi)


def percentile_range(hist: HistogramObserver, q: float = DEFAULT_PERCENTILE, symmetric: bool = False):
    """``(percentile(100 - q), percentile(q))`` of the histogram, ``q`` in ``[50, 100]``."""
    if not 50.0 <= q <= 100.0:
        raise ValueError(f"percentile q={q} must be in [50, 100] (e.g. 99.99)")
    lo, hi = torch.tensor(hist.percentile(100.0 - q)), torch.tensor(hist.percentile(q))
    return _symmetrize(lo, hi) if symmetric else (lo, hi)


def mse_uniform_range(hist: HistogramObserver, bits: int, symmetric: bool, grid: int = 100) -> UniformRangeResult:
    """Clipping range minimising the expected uniform-quantization MSE on the histogram.

    Candidates keep a fraction of the observed range: symmetric, ``a = f max|x|``
    on a ``grid``-point grid of ``f`` in ``(0, 1]``; asymmetric, ``(f_lo min, f_hi
    max)`` on a ``sqrt(grid) x sqrt(grid)`` grid. A second grid of the same size
    refines around the best (one coarse step each way).
    """
    if grid < 4:
        raise ValueError(f"grid={grid} must be >= 4")
    counts, edges = hist.support()
    lo0, hi0 = min(float(edges[0]), 0.0), max(float(edges[-1]), 0.0)
    if symmetric:
        hi0 = max(-lo0, hi0)
        lo0 = -hi0
    n = grid if symmetric else max(2, math.isqrt(grid))
    score = lambda fl, fh: expected_sq_error(  # noqa: E731
        uniform_levels(-fl * lo0, fh * hi0, bits, symmetric), counts, edges)
    one = torch.ones(1, dtype=torch.float64)
    best_l, best_h, best = one, one, score(one, one)
    minmax = float(best)
    for centre, half in (((0.5, 0.5), 0.5), (None, 1.0 / n)):
        cl, ch = centre or (float(best_l), float(best_h))
        fl, fh = _grid(cl, half, n), _grid(ch, half, n)
        if not symmetric:
            fl, fh = fl.repeat_interleave(n), fh.repeat(n)
        else:
            fh = fl
        mse = score(fl, fh)
        i = int(torch.argmin(mse))
        if mse[i] < best:
            best_l, best_h, best = fl[i:i + 1], fh[i:i + 1], mse[i:i + 1]
    return UniformRangeResult(float(best_l) * lo0, float(best_h) * hi0, float(best), minmax)


def pwlq_search_range(hist: HistogramObserver, bits: int, **kwargs) -> PwlqSearchResult:
    """PWLQ breakpoint (and code split) search on the histogram; see :func:`search_pwlq`."""
    counts, edges = hist.support()
    return search_pwlq(counts, edges, bits, **kwargs)


def _symmetrize(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.maximum(-torch.as_tensor(lo), torch.as_tensor(hi))
    return -a, a


def _grid(centre: float, half: float, n: int) -> torch.Tensor:
    """``n`` fractions in ``(centre - half, centre + half]`` clipped to ``(0, 1]``."""
    return torch.linspace(centre - half, centre + half, n + 1, dtype=torch.float64)[1:].clamp(1e-6, 1.0)
