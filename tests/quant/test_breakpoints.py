"""Gaussian/Laplacian optimal breakpoints: numeric optimum, paper's closed forms."""

import math

import numpy as np
import pytest
from scipy import optimize, stats

from ptq_protein.quant.breakpoints import (
    Distribution,
    approx_breakpoint,
    breakpoint_from_stats,
    breakpoint_objective,
    optimal_breakpoint,
)


@pytest.mark.parametrize("m, expected", [(3.0, 1.158), (5.0, 1.589), (10.0, 2.210)])
def test_gaussian_reference_breakpoints(m, expected):
    assert optimal_breakpoint(m, "gaussian") == pytest.approx(expected, abs=5e-4)


def _reference_root(m: float, dist: Distribution) -> float:
    """Independent solution: root of dE/dp written with scipy.stats' pdf/cdf."""
    law = stats.norm() if dist is Distribution.GAUSSIAN else stats.laplace(scale=1 / math.sqrt(2))
    big_f = lambda p: law.cdf(p) - law.cdf(-p)  # noqa: E731
    f = lambda p: 2 * law.pdf(p)  # noqa: E731
    de = lambda p: 2 * p * big_f(p) + p * p * f(p) - 2 * (m - p) * (1 - big_f(p)) - (m - p) ** 2 * f(p)  # noqa: E731
    return optimize.brentq(de, 1e-9, m - 1e-9, xtol=1e-12)


@pytest.mark.parametrize("dist", list(Distribution))
@pytest.mark.parametrize("m", [2.0, 4.0, 7.5, 12.0])
def test_numeric_optimum_matches_independent_root(dist, m):
    p = optimal_breakpoint(m, dist)
    assert p == pytest.approx(_reference_root(m, dist), abs=1e-6)
    e = breakpoint_objective(p, m, dist)
    assert e <= breakpoint_objective(p * 0.98, m, dist) and e <= breakpoint_objective(p * 1.02, m, dist)


@pytest.mark.parametrize("dist", list(Distribution))
def test_closed_forms_within_005_of_optimum(dist):
    # Fang et al. 2020 fits; checked on m in [2, 11] (they drift beyond ~12).
    worst = max(abs(approx_breakpoint(m, dist) - optimal_breakpoint(m, dist)) for m in np.linspace(2, 11, 37))
    assert worst < 0.05


def test_closed_form_values():
    assert approx_breakpoint(4.0, "gaussian") == pytest.approx(math.log(0.86143114 * 4 + 0.607901097496529))
    assert approx_breakpoint(4.0, "laplacian") == pytest.approx(0.80304483 * 2 - 0.3166785508381478)


def test_breakpoint_from_stats_scales_with_sigma():
    assert breakpoint_from_stats(10.0, 2.0) == pytest.approx(2.0 * optimal_breakpoint(5.0))
    assert breakpoint_from_stats(10.0, 2.0, "laplacian", closed_form=True) == pytest.approx(
        2.0 * approx_breakpoint(5.0, "laplacian"))
    assert breakpoint_from_stats(3.0, 0.0) == 1.5  # constant data


@pytest.mark.parametrize("m", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_range(m):
    with pytest.raises(ValueError, match="m="):
        optimal_breakpoint(m)
    with pytest.raises(ValueError):
        breakpoint_from_stats(m, 1.0)
    with pytest.raises(ValueError):
        Distribution("cauchy")
