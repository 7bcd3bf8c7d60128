"""Optimal PWLQ breakpoints for Gaussian and Laplacian data (Fang et al., ECCV 2020).

For data normalised to unit variance with range ``m = max|x| / sigma``, one
breakpoint ``p`` splits ``[0, m]`` into a centre ``[0, p]`` and a tail ``(p, m]``
with the same number of codes each. The expected squared error is then
proportional to the step-size-squared-weighted mass

    ``E(p) = p^2 F(p) + (m - p)^2 (1 - F(p))``,  ``F(p) = P(|x| <= p)``,

(paper, Sec. 3.3). :func:`optimal_breakpoint` minimises it numerically;
:func:`approx_breakpoint` is the paper's closed-form fit (the coefficients are
the ones in the paper / its released code, ``find_optimal_breakpoint``). The fits
agree with the numeric optimum to within 0.05 for ``m`` in ``[2, 11]``; they
drift beyond (0.067 for the Gaussian at ``m = 15``). The histogram MSE search,
which needs no distribution assumption, is in
:mod:`ptq_protein.quant.breakpoint_search`.
"""

from __future__ import annotations

import math
from enum import Enum

__all__ = [
    "Distribution",
    "breakpoint_objective",
    "optimal_breakpoint",
    "approx_breakpoint",
    "breakpoint_from_stats",
]

# Closed-form fits, Fang et al. 2020 (PWLQ), Sec. 3.3:
_GAUSS_FIT = (0.86143114, 0.607901097496529)  # p* = ln(a * m + b)
_LAPLACE_FIT = (0.80304483, -0.3166785508381478)  # p* = a * sqrt(m) + b
_LAPLACE_B = 1.0 / math.sqrt(2.0)  # Laplace scale with unit variance (var = 2 b^2)
_XATOL = 1e-10


class Distribution(str, Enum):
    """Reference distributions of the PWLQ breakpoint analysis (unit variance)."""

    GAUSSIAN = "gaussian"
    LAPLACIAN = "laplacian"


def _abs_cdf(p: float, dist: Distribution) -> float:
    """``P(|x| <= p)`` for a zero-mean, unit-variance ``dist``."""
    if dist is Distribution.GAUSSIAN:
        return math.erf(p / math.sqrt(2.0))
    return -math.expm1(-p / _LAPLACE_B)


def breakpoint_objective(p: float, m: float, dist: Distribution | str = Distribution.GAUSSIAN) -> float:
    """``E(p) = p^2 F(p) + (m - p)^2 (1 - F(p))`` (normalised units, ``0 <= p <= m``)."""
    f = _abs_cdf(p, Distribution(dist))
    return p * p * f + (m - p) ** 2 * (1.0 - f)


def optimal_breakpoint(m: float, dist: Distribution | str = Distribution.GAUSSIAN) -> float:
    """Numerically optimal breakpoint ``p* / sigma`` for normalised range ``m``.

    Bounded scalar minimisation (scipy, Brent's method) of
    :func:`breakpoint_objective` on ``(0, m)``; e.g. 1.158 at ``m = 3`` for a
    Gaussian, 1.589 at ``m = 5``, 2.210 at ``m = 10``.
    """
    from scipy.optimize import minimize_scalar

    m = _check_m(m)
    dist = Distribution(dist)
    res = minimize_scalar(
        breakpoint_objective, bounds=(0.0, m), args=(m, dist), method="bounded", options={"xatol": _XATOL}
    )
    return float(res.x)


def approx_breakpoint(m: float, dist: Distribution | str = Distribution.GAUSSIAN) -> float:
    """The paper's closed-form fit of ``p* / sigma``: Gaussian ``ln(0.8614 m + 0.6079)``,
    Laplacian ``0.8030 sqrt(m) - 0.3167``. Valid roughly for ``m`` in ``[2, 11]``."""
    m = _check_m(m)
    if Distribution(dist) is Distribution.GAUSSIAN:
        a, b = _GAUSS_FIT
        return math.log(a * m + b)
    a, b = _LAPLACE_FIT
    return a * math.sqrt(m) + b


def breakpoint_from_stats(
    abs_max: float,
    std: float,
    dist: Distribution | str = Distribution.GAUSSIAN,
    closed_form: bool = False,
) -> float:
    """Breakpoint in data units from ``max|x|`` and ``sigma`` (the paper's recipe).

    Returns ``sigma * p*(max|x| / sigma)``, clipped into ``(0, abs_max)``; a zero
    ``std`` (constant data) gives ``abs_max / 2``.
    """
    if not (math.isfinite(abs_max) and math.isfinite(std)) or abs_max <= 0 or std < 0:
        raise ValueError(f"need finite abs_max > 0 and std >= 0, got abs_max={abs_max}, std={std}")
    if std == 0:
        return 0.5 * abs_max
    m = abs_max / std
    fn = approx_breakpoint if closed_form else optimal_breakpoint
    p = std * fn(m, dist)
    return min(max(p, 1e-6 * abs_max), (1 - 1e-6) * abs_max)


def _check_m(m: float) -> float:
    m = float(m)
    if not math.isfinite(m) or m <= 0:
        raise ValueError(f"normalised range m={m} must be finite and > 0")
    return m
