"""Streaming moments against one-shot float64 references (scipy.stats)."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from ptq_protein.quant.stats import MomentsObserver, batch_moments, merge_moments


def _skewed_batches(gen):
    sizes = [1, 2, 7, 100, 1, 3000, 50, 1, 999]
    return [torch.exp(torch.randn(n, 3, generator=gen, dtype=torch.float64)) * 5 + 100 for n in sizes]


def test_streaming_moments_equal_one_shot(gen):
    batches = _skewed_batches(gen)
    data = torch.cat(batches)
    obs = MomentsObserver()
    for b in batches:
        obs.update(b)
    flat = data.flatten().numpy()
    assert float(obs.count) == flat.size
    assert float(obs.mean) == pytest.approx(flat.mean(), rel=1e-12)
    assert float(obs.variance()) == pytest.approx(flat.var(), rel=1e-9)
    assert float(obs.variance(unbiased=True)) == pytest.approx(flat.var(ddof=1), rel=1e-9)
    assert float(obs.skewness) == pytest.approx(stats.skew(flat), rel=1e-9)
    assert float(obs.kurtosis) == pytest.approx(stats.kurtosis(flat, fisher=False), rel=1e-9)
    assert float(obs.excess_kurtosis) == pytest.approx(stats.kurtosis(flat), rel=1e-9)
    assert float(obs.min_val) == flat.min() and float(obs.max_val) == flat.max()
    assert float(obs.abs_max) == np.abs(flat).max()


def test_per_channel_moments(gen):
    batches = _skewed_batches(gen)
    data = torch.cat(batches).numpy()
    obs = MomentsObserver(per_channel=True)
    for b in batches:
        obs.update(b)
    np.testing.assert_allclose(obs.mean.numpy(), data.mean(0), rtol=1e-12)
    np.testing.assert_allclose(obs.std().numpy(), data.std(0), rtol=1e-9)
    np.testing.assert_allclose(obs.skewness.numpy(), stats.skew(data, axis=0), rtol=1e-9)
    np.testing.assert_allclose(obs.kurtosis.numpy(), stats.kurtosis(data, axis=0, fisher=False), rtol=1e-9)


def test_merge_is_order_independent(gen):
    a, b = torch.randn(50, generator=gen, dtype=torch.float64), torch.randn(7, generator=gen, dtype=torch.float64) + 3
    ab, ba = merge_moments(batch_moments(a), batch_moments(b)), merge_moments(batch_moments(b), batch_moments(a))
    one = batch_moments(torch.cat([a, b]))
    for f in ("n", "mean", "m2", "m3", "m4"):
        torch.testing.assert_close(getattr(ab, f), getattr(one, f), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(getattr(ba, f), getattr(one, f), rtol=1e-12, atol=1e-12)


def test_gaussian_sanity(gen):
    obs = MomentsObserver()
    for _ in range(20):
        obs.update(torch.randn(10_000, generator=gen))
    assert abs(float(obs.skewness)) < 0.05 and abs(float(obs.excess_kurtosis)) < 0.1


def test_constant_data_has_undefined_shape_moments():
    obs = MomentsObserver()
    obs.update(torch.full((100,), 0.1))
    obs.update(torch.full((3,), 0.1))
    assert float(obs.std()) == pytest.approx(0.0, abs=1e-15)
    assert math.isnan(float(obs.skewness)) and math.isnan(float(obs.kurtosis))
    with pytest.raises(ValueError, match="no values"):
        _ = MomentsObserver().mean


def test_known_extremes_give_the_same_state():
    """Passing the batch's (min, max) skips a scan and changes nothing."""
    torch.manual_seed(3)
    a, b = MomentsObserver(), MomentsObserver()
    for _ in range(3):
        x = (torch.randn(500) * 4 + 1).to(torch.float64)  # float32 values, as calibration samples are
        a.update(x)
        b.update(x, extremes=tuple(torch.aminmax(x.float())))
    assert torch.equal(a.min_val, b.min_val) and torch.equal(a.max_val, b.max_val)
    assert torch.equal(a.moments.m4, b.moments.m4)
