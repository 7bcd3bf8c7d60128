"""Streaming histogram (exact integer-factor growth) and the exact histogram MSE."""

import numpy as np
import pytest
import torch

from ptq_protein.quant.breakpoint_search import uniform_levels
from ptq_protein.quant.histogram import HistogramObserver, expected_sq_error
from ptq_protein.quant.observers import NonFiniteError


def _batches(gen, n_batches=30):
    """Batches whose spread and centre keep growing, forcing repeated re-binning."""
    return [torch.randn(2000, generator=gen, dtype=torch.float64) * (1 + 0.3 * i) + 0.2 * i for i in range(n_batches)]


def test_streaming_counts_equal_binning_all_data_on_final_grid(gen):
    hist = HistogramObserver(bins=512)
    batches = _batches(gen)
    for b in batches:
        hist.update(b)
    data = torch.cat(batches)
    assert hist.total == data.numel()
    assert hist.counts.numel() == 512  # memory independent of the number of updates
    direct = torch.bincount(((data - hist.lo) / hist.width).floor().clamp(0, 511).long(), minlength=512)
    assert float((hist.counts - direct.double()).abs().sum()) <= 2  # exact merge (float ties at edges aside)
    assert hist.min_val == float(data.min()) and hist.max_val == float(data.max())
    assert (data.max() - data.min()) / (hist.width * 512) > 0.45  # growth keeps >= ~half the bins in use


@pytest.mark.parametrize("q", [0.0, 0.1, 1.0, 25.0, 50.0, 90.0, 99.0, 99.99, 100.0])
def test_percentile_within_one_bin_width(q, gen):
    hist = HistogramObserver(bins=2048)
    batches = _batches(gen)
    for b in batches:
        hist.update(b)
    exact = np.percentile(torch.cat(batches).numpy(), q)
    assert abs(hist.percentile(q) - exact) <= hist.width


def test_constant_then_spread_and_point_mass_support():
    hist = HistogramObserver(bins=64)
    hist.update(torch.full((100,), 2.5))
    assert hist.percentile(0) == hist.percentile(50) == hist.percentile(100) == 2.5
    counts, edges = hist.support()
    assert float(expected_sq_error(torch.tensor([2.5]), counts, edges)) == 0.0
    assert float(expected_sq_error(torch.tensor([2.0, 3.0]), counts, edges)) == pytest.approx(0.25)
    hist.update(torch.linspace(-100, 100, 1000))
    assert hist.total == 1100 and hist.min_val == -100 and hist.max_val == 100
    assert abs(hist.percentile(50) - 2.5) <= hist.width


def test_zero_first_batch_then_growth():
    hist = HistogramObserver(bins=128)
    hist.update(torch.zeros(10))
    hist.update(torch.tensor([1e3, -1e3]))
    assert hist.total == 12 and hist.edges[0] <= -1e3 and hist.edges[-1] >= 1e3
    assert abs(hist.percentile(50)) <= hist.width


def test_histogram_errors():
    with pytest.raises(ValueError, match="bins"):
        HistogramObserver(bins=1)
    hist = HistogramObserver()
    with pytest.raises(ValueError, match="no values"):
        hist.percentile(50)
    with pytest.raises(NonFiniteError, match="NaN in activations"):
        hist.update(torch.tensor([0.0, float("nan")]))
    hist.update(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="percentile"):
        hist.percentile(101)


def _numeric_error(levels: np.ndarray, counts: np.ndarray, edges: np.ndarray, per_bin: int = 4000) -> float:
    """Midpoint-rule reference: sample each bin densely and round to the nearest level."""
    total = 0.0
    for c, a, b in zip(counts, edges[:-1], edges[1:]):
        x = a + (np.arange(per_bin) + 0.5) / per_bin * (b - a)
        q = levels[np.abs(x[:, None] - levels[None, :]).argmin(1)]
        total += c * np.mean((x - q) ** 2)
    return total / counts.sum()


@pytest.mark.parametrize("n_levels", [3, 9, 40])  # fewer and more levels than bins: both code paths
def test_expected_sq_error_against_dense_integration(n_levels):
    rng = np.random.default_rng(0)
    edges = np.sort(rng.uniform(-3, 4, 13))
    counts = rng.uniform(0, 5, 12)
    levels = np.sort(rng.uniform(-2.5, 3.5, n_levels))
    got = float(expected_sq_error(torch.tensor(levels), torch.tensor(counts), torch.tensor(edges)))
    assert got == pytest.approx(_numeric_error(levels, counts, edges), rel=1e-5)


def test_expected_sq_error_custom_bounds_and_batch():
    counts, edges = torch.tensor([1.0]), torch.tensor([0.0, 1.0])
    levels = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    # Threshold at 0.5 (nearest) gives 1/12; at 1.0 everything maps to 0: E[x^2] = 1/3.
    got = expected_sq_error(levels, counts, edges, bounds=torch.tensor([[0.5], [1.0]]))
    torch.testing.assert_close(got, torch.tensor([1 / 12, 1 / 3], dtype=torch.float64))


def test_expected_sq_error_matches_samples_for_uniform_quantizer(gen):
    x = torch.randn(200_000, generator=gen, dtype=torch.float64)
    hist = HistogramObserver(2048)
    hist.update(x)
    counts, edges = hist.support()
    for bits in (4, 8):
        levels = uniform_levels(2.5, 2.5, bits, True)
        got = float(expected_sq_error(levels, counts, edges))
        idx = torch.searchsorted(0.5 * (levels[1:] + levels[:-1]), x)
        empirical = float(((levels[idx] - x) ** 2).mean())
        assert got == pytest.approx(empirical, rel=0.01)


def test_known_extremes_give_the_same_histogram():
    from ptq_protein.quant.histogram import HistogramObserver

    torch.manual_seed(4)
    a, b = HistogramObserver(64), HistogramObserver(64)
    for scale in (1.0, 5.0, 0.5):
        x = (torch.randn(1000) * scale).to(torch.float64)
        a.update(x)
        b.update(x, extremes=torch.aminmax(x))
    assert torch.equal(a.counts, b.counts)
    assert (a.lo, a.width, a.min_val, a.max_val) == (b.lo, b.width, b.min_val, b.max_val)
