"""Range choosers: min-max, top-k, percentile, MSE-optimal uniform clipping, PWLQ search."""

import numpy as np
import pytest
import torch

from ptq_protein.quant.breakpoint_search import search_pwlq
from ptq_protein.quant.histogram import HistogramObserver
from ptq_protein.quant.metrics import quantization_mse
from ptq_protein.quant.observers import MinMaxObserver, TopKObserver
from ptq_protein.quant.ranges import (
    minmax_range,
    mse_uniform_range,
    percentile_range,
    pwlq_search_range,
    topk_range,
)
from ptq_protein.quant.stats import MomentsObserver
from ptq_protein.quant.uniform import choose_qparams, fake_quantize

from .conftest import gaussian


def _observe(obs, x, n_batches=10):
    for chunk in x.chunk(n_batches):
        obs.update(chunk)
    return obs


def _empirical_mse(x, lo, hi, bits, symmetric):
    s, zp = choose_qparams(lo, hi, bits, symmetric)
    return quantization_mse(x, lambda t: fake_quantize(t, s, zp, bits, symmetric))


def test_minmax_and_topk_ranges(gen):
    x = torch.randn(10_000, generator=gen, dtype=torch.float64) + 0.5
    for obs in (_observe(MinMaxObserver(), x), _observe(MomentsObserver(), x)):
        lo, hi = minmax_range(obs)
        assert float(lo) == float(x.min()) and float(hi) == float(x.max())
        lo, hi = minmax_range(obs, symmetric=True)
        assert float(hi) == -float(lo) == float(x.abs().max())
    lo, hi = topk_range(_observe(TopKObserver(10), x), symmetric=True)
    assert float(hi) == -float(lo) and 2.0 < float(hi) < float(x.abs().max())
    with pytest.raises(ValueError, match="no values"):
        minmax_range(MinMaxObserver())


def test_percentile_range(gen):
    x = torch.randn(50_000, generator=gen, dtype=torch.float64) * 2 - 1
    hist = _observe(HistogramObserver(), x)
    lo, hi = percentile_range(hist, 99.9)
    assert abs(float(lo) - np.percentile(x.numpy(), 0.1)) <= hist.width
    assert abs(float(hi) - np.percentile(x.numpy(), 99.9)) <= hist.width
    slo, shi = percentile_range(hist, 99.9, symmetric=True)
    assert float(shi) == -float(slo) == max(-float(lo), float(hi))
    with pytest.raises(ValueError, match="50, 100"):
        percentile_range(hist, 10.0)


@pytest.mark.parametrize("bits", [4, 8])
def test_mse_uniform_range_symmetric_matches_brute_force(bits):
    x = gaussian(50_000, 3)
    res = mse_uniform_range(_observe(HistogramObserver(), x), bits, symmetric=True)
    assert res.hi == -res.lo and res.mse <= res.minmax_mse
    m = float(x.abs().max())
    brute = min(_empirical_mse(x, -a, a, bits, True) for a in np.linspace(0.3 * m, m, 150))
    assert _empirical_mse(x, res.lo, res.hi, bits, True) <= brute * 1.01
    assert res.mse == pytest.approx(_empirical_mse(x, res.lo, res.hi, bits, True), rel=0.02)


def test_mse_uniform_range_asymmetric(gen):
    x = torch.nn.functional.gelu(torch.randn(50_000, generator=gen, dtype=torch.float64) * 2)
    res = mse_uniform_range(_observe(HistogramObserver(), x), 4, symmetric=False)
    assert res.lo < 0 < res.hi <= float(x.max()) and res.mse < res.minmax_mse
    grid = [(a, b) for a in np.linspace(0.02, 0.2, 10) for b in np.linspace(1.0, float(x.max()), 40)]
    brute = min(_empirical_mse(x, -a, b, 4, False) for a, b in grid)
    assert _empirical_mse(x, res.lo, res.hi, 4, False) <= brute * 1.02


def test_mse_uniform_range_constant_data():
    hist = _observe(HistogramObserver(), torch.full((100,), 0.5), 2)
    res = mse_uniform_range(hist, 8, symmetric=True)
    assert res.hi > 0 and res.mse <= res.minmax_mse
    with pytest.raises(ValueError, match="grid"):
        mse_uniform_range(hist, 8, True, grid=2)


def test_pwlq_search_range_uses_histogram_support(gen):
    hist = _observe(HistogramObserver(), torch.randn(20_000, generator=gen))
    got = pwlq_search_range(hist, 6, n_breakpoints=2)
    assert got == search_pwlq(*hist.support(), 6, n_breakpoints=2)
