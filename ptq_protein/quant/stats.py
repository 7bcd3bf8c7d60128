"""Streaming moments (count, mean, variance, skewness, kurtosis, min, max).

Batches are reduced to their central moment sums in float64 and merged with the
pairwise update of Chan, Golub & LeVeque (1979), extended to third and fourth
moments by Terriberry (2007) / Pébay (2008, SAND2008-6212). This is exact up to
float64 rounding whatever the batch sizes, so the streaming result equals the
one-shot computation to ~1e-12 relative.

The per-site report uses range, skewness (asymmetry) and kurtosis; PWLQ uses
``std`` to normalise ``max|x|``. For a constant input ``M2 = 0``: skewness and
kurtosis are undefined and returned as NaN (``std`` is 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ptq_protein.quant.observers import fold_extremes, prepare_update

__all__ = ["Moments", "batch_moments", "merge_moments", "MomentsObserver"]


@dataclass(frozen=True)
class Moments:
    """Count and central moment sums ``M_p = sum (x - mean)^p`` (float64, shape ``[]`` or ``[C]``)."""

    n: torch.Tensor
    mean: torch.Tensor
    m2: torch.Tensor
    m3: torch.Tensor
    m4: torch.Tensor


def batch_moments(x: torch.Tensor) -> Moments:
    """Moments of a float64 batch, reduced over dim 0 (pass a flat tensor for per-tensor)."""
    n = torch.full(x.shape[1:], float(x.shape[0]), dtype=torch.float64)
    mean = x.mean(0)
    d = x - mean
    d2 = d * d
    if x.dim() == 1:  # dot products: no temporaries for the third and fourth powers
        return Moments(n, mean, d2.sum(), torch.dot(d2, d), torch.dot(d2, d2))
    return Moments(n, mean, d2.sum(0), (d2 * d).sum(0), (d2 * d2).sum(0))


def merge_moments(a: Moments, b: Moments) -> Moments:
    """Combine two moment sets as if their data had been pooled.

    Per-tensor moments (0-dim) are merged in Python floats (float64 too): one
    call per calibration call and site, where some 35 scalar tensor operations
    cost more than the statistics they merge.
    """
    fields = ("n", "mean", "m2", "m3", "m4")
    if a.mean.dim() == 0 and b.mean.dim() == 0:
        merged = _merged(*(float(getattr(m, f)) for m in (a, b) for f in fields))
        return Moments(*(torch.tensor(v, dtype=torch.float64) for v in merged))
    return Moments(*_merged(*(getattr(m, f) for m in (a, b) for f in fields)))


def _merged(na, ma, m2a, m3a, m4a, nb, mb, m2b, m3b, m4b):
    """Chan-Terriberry-Pebay pairwise merge; floats or tensors alike."""
    n = na + nb
    delta = mb - ma
    na_nb = na * nb
    mean = ma + delta * nb / n
    m2 = m2a + m2b + delta**2 * na_nb / n
    m3 = (m3a + m3b + delta**3 * na_nb * (na - nb) / n**2
          + 3.0 * delta * (na * m2b - nb * m2a) / n)
    m4 = (m4a + m4b + delta**4 * na_nb * (na**2 - na_nb + nb**2) / n**3
          + 6.0 * delta**2 * (na**2 * m2b + nb**2 * m2a) / n**2
          + 4.0 * delta * (na * m3b - nb * m3a) / n)
    return n, mean, m2, m3, m4


class MomentsObserver:
    """Running moments and extremes, per tensor or per channel (last dim of ``[tokens, C]``).

    Memory is a handful of float64 scalars (or ``[C]`` vectors) however many
    updates arrive.
    """

    def __init__(self, per_channel: bool = False):
        self.per_channel = per_channel
        self.moments: Moments | None = None
        self.min_val: torch.Tensor | None = None
        self.max_val: torch.Tensor | None = None

    def update(self, x: torch.Tensor, checked: bool = False, extremes: tuple | None = None) -> None:
        """Merge a batch of finite values; empty input is ignored.

        ``extremes`` = ``(min, max)`` of ``x`` when the caller already has them
        (per-tensor only): saves two passes over ``x``.
        """
        x = prepare_update(x, self.per_channel, self.min_val, checked)
        if x is None:
            return
        b = batch_moments(x)
        self.moments = b if self.moments is None else merge_moments(self.moments, b)
        use_known = extremes is not None and not self.per_channel
        fold_extremes(self,
                      torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in extremes]) if use_known else x)

    def _m(self) -> Moments:
        if self.moments is None:
            raise ValueError("MomentsObserver has seen no values: run calibration data through the site")
        return self.moments

    @property
    def count(self) -> torch.Tensor:
        return self._m().n

    @property
    def mean(self) -> torch.Tensor:
        return self._m().mean

    def variance(self, unbiased: bool = False) -> torch.Tensor:
        """Population variance ``M2 / n`` (or ``M2 / (n - 1)``, as ``torch.var``)."""
        m = self._m()
        return m.m2 / (m.n - 1 if unbiased else m.n).clamp(min=1)

    def std(self, unbiased: bool = False) -> torch.Tensor:
        return self.variance(unbiased).sqrt()

    @property
    def skewness(self) -> torch.Tensor:
        """Sample skewness ``g1 = sqrt(n) M3 / M2^1.5`` (NaN for constant data)."""
        m = self._m()
        return _undefined_if_flat(m, m.n.sqrt() * m.m3 / m.m2.clamp(min=0) ** 1.5)

    @property
    def kurtosis(self) -> torch.Tensor:
        """Pearson kurtosis ``n M4 / M2^2`` (3 for a Gaussian; NaN for constant data)."""
        m = self._m()
        return _undefined_if_flat(m, m.n * m.m4 / m.m2**2)

    @property
    def excess_kurtosis(self) -> torch.Tensor:
        return self.kurtosis - 3.0

    @property
    def abs_max(self) -> torch.Tensor:
        self._m()
        return torch.maximum(-self.min_val, self.max_val)


def _undefined_if_flat(m: Moments, value: torch.Tensor) -> torch.Tensor:
    """NaN where the variance is zero (relative to the mean's magnitude)."""
    flat = m.m2 <= (1e-30 + (m.mean**2) * 1e-24) * m.n
    return torch.where(flat, torch.full_like(value, float("nan")), value)
