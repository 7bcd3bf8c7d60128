"""Histogram-MSE PWLQ search, and PWLQ's MSE versus uniform at the same bits and range.

The issue asked for PWLQ below 9/16 of uniform's MSE. On ONE b-bit code the
paper's recipe (one breakpoint, codes split equally) gives ~0.57-0.64 on
Gaussian samples with max|x| ~ 4.4-5 sigma (asymptotically 4 E(p*) / m^2), so
the 9/16 bound is asserted for what does meet it: the searched breakpoint with
a searched code split (and 2-3 breakpoints), and Laplacian data. The equal-split
Gaussian ratio is checked against its asymptotic closed form instead.
"""

import math

import pytest
import torch
from scipy import optimize

from ptq_protein.quant.breakpoint_search import search_pwlq, uniform_levels
from ptq_protein.quant.breakpoints import breakpoint_from_stats, breakpoint_objective
from ptq_protein.quant.codebook import pwlq_fake_quantize
from ptq_protein.quant.histogram import HistogramObserver, expected_sq_error
from ptq_protein.quant.metrics import quantization_mse
from ptq_protein.quant.pwlq import symmetric_pwlq
from ptq_protein.quant.uniform import choose_qparams, fake_quantize, qrange

from .conftest import gaussian, laplacian

NINE_SIXTEENTHS = 9 / 16
N_SAMPLES = 100_000
SAMPLES = {"gaussian": gaussian(N_SAMPLES, 1), "laplacian": laplacian(N_SAMPLES, 1)}


def _histogram(x: torch.Tensor):
    hist = HistogramObserver(2048)
    hist.update(x)
    return hist.support()


def _ratio(x: torch.Tensor, cb, bits: int) -> float:
    """Measured MSE of the codebook over uniform's, same bits and range max|x|."""
    m = float(x.abs().max())
    s, zp = choose_qparams(-m, m, bits, True)
    uni = quantization_mse(x, lambda t: fake_quantize(t, s, zp, bits, True))
    return quantization_mse(x, lambda t: pwlq_fake_quantize(t, cb)) / uni


@pytest.fixture(scope="module")
def searched():
    """Searched codebooks per (dist, bits, variant), computed once for the module."""
    out = {}
    for dist, x in SAMPLES.items():
        counts, edges = _histogram(x)
        out[dist, 8, "1bp_equal"] = search_pwlq(counts, edges, 8, 1, search_split=False)
        for bits in (4, 6, 8):
            for k in (1, 2, 3):
                out[dist, bits, f"{k}bp"] = search_pwlq(counts, edges, bits, k)
    return out


@pytest.mark.parametrize("dist", ["gaussian", "laplacian"])
@pytest.mark.parametrize("bits", [4, 6, 8])
def test_searched_pwlq_beats_nine_sixteenths(searched, dist, bits):
    x = SAMPLES[dist]
    r1, r2, r3 = (_ratio(x, searched[dist, bits, f"{k}bp"].codebook, bits) for k in (1, 2, 3))
    assert r1 < NINE_SIXTEENTHS  # one breakpoint with the searched code split
    assert r2 < 0.5 and r2 < r1  # a second breakpoint helps
    assert r3 < r2 + 0.01


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_laplacian_meets_nine_sixteenths_with_paper_recipe(bits):
    x = SAMPLES["laplacian"]
    m = float(x.abs().max())
    cb = symmetric_pwlq(m, breakpoint_from_stats(m, float(x.std()), "laplacian"), bits)
    assert _ratio(x, cb, bits) < 0.4


def test_gaussian_equal_split_matches_asymptotic_ratio():
    # Equal split on one 8-bit code: ratio -> 4 E(p*) / m^2 (= 0.617 at m = 4.55).
    x = SAMPLES["gaussian"]
    m_abs, sd = float(x.abs().max()), float(x.std())
    m = m_abs / sd
    theory = 4 * optimize.minimize_scalar(lambda p: breakpoint_objective(p, m), bounds=(0, m),
                                          method="bounded").fun / m**2
    cb = symmetric_pwlq(m_abs, breakpoint_from_stats(m_abs, sd), 8)
    measured = _ratio(x, cb, 8)
    assert measured == pytest.approx(theory, abs=0.02)
    assert measured > NINE_SIXTEENTHS  # the honest result: 9/16 needs a better split


def test_searched_split_matches_asymptotic_optimum(searched):
    # Optimal split of one code: ratio -> min_p (a^(1/3) + b^(1/3))^3 / m^2,
    # a = p^2 F(p), b = (m - p)^2 (1 - F(p)) (Lagrange on n_c + n_t = qmax).
    x = SAMPLES["gaussian"]
    m = float(x.abs().max() / x.std())

    def split_ratio(p):
        f = math.erf(p / math.sqrt(2))
        return ((p * p * f) ** (1 / 3) + ((m - p) ** 2 * (1 - f)) ** (1 / 3)) ** 3 / m**2

    theory = optimize.minimize_scalar(split_ratio, bounds=(0.01, m - 0.01), method="bounded").fun
    assert _ratio(x, searched["gaussian", 8, "1bp"].codebook, 8) == pytest.approx(theory, abs=0.02)


def test_equal_split_search_finds_the_gaussian_breakpoint(searched):
    res = searched["gaussian", 8, "1bp_equal"]
    x = SAMPLES["gaussian"]
    sd = float(x.std())
    assert res.codes_per_piece == ((64, 63), (64, 63))
    assert res.pos_breaks[0] / sd == pytest.approx(breakpoint_from_stats(float(x.abs().max()), sd) / sd, abs=0.1)


def test_reported_mse_is_the_codebooks_measured_mse(searched):
    for (dist, bits, variant), res in searched.items():
        if variant not in ("1bp", "3bp"):
            continue
        x = SAMPLES[dist]
        measured = quantization_mse(x, lambda t, cb=res.codebook: pwlq_fake_quantize(t, cb))
        assert res.mse == pytest.approx(measured, rel=0.03)
        assert res.ratio == pytest.approx(res.mse / res.uniform_mse)
        lo, hi = qrange(bits, True)
        assert (res.codebook.qmin, res.codebook.qmax) == (lo, hi)


def test_asymmetric_search_on_skewed_data(gen):
    # GELU outputs: range [-0.17, ~8]; the searched zero code gives the short
    # negative side few codes, which a fixed 50/50 side split cannot do.
    x = torch.nn.functional.gelu(torch.randn(50_000, generator=gen, dtype=torch.float64) * 2)
    counts, edges = _histogram(x)
    sym = search_pwlq(counts, edges, 6, 1, symmetric=True)
    fixed = search_pwlq(counts, edges, 6, 1, symmetric=False, search_split=False)
    asym = search_pwlq(counts, edges, 6, 1, symmetric=False)
    assert asym.codebook.qmin == -32 and asym.zero_code < -16
    assert asym.codebook.zero_code == asym.zero_code and fixed.zero_code == 0
    assert asym.mse < 0.5 * asym.uniform_mse  # beats the asymmetric (affine) uniform quantizer
    assert asym.mse < 0.5 * fixed.mse and asym.mse < 0.3 * sym.mse
    assert 0 < asym.neg_breaks[0] < 0.17 < asym.pos_breaks[0]
    measured = quantization_mse(x, lambda t: pwlq_fake_quantize(t, asym.codebook))
    assert asym.mse == pytest.approx(measured, rel=0.03)
    asym2 = search_pwlq(counts, edges, 6, 2, symmetric=False)
    assert asym2.mse < asym.mse
    assert float(expected_sq_error(uniform_levels(-float(edges[0]), float(edges[-1]), 6, False),
                                   counts, edges)) == pytest.approx(asym.uniform_mse)


def test_constant_and_invalid_inputs():
    counts, edges = torch.tensor([5.0]), torch.tensor([1.5, 1.5])
    res = search_pwlq(counts, edges, 8, 1)
    assert res.mse < 1e-4 and res.codebook.levels()[-1] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="n_breakpoints"):
        search_pwlq(counts, edges, 8, 4)
    with pytest.raises(ValueError, match="more bits"):
        search_pwlq(counts, edges, 2, 1)
    with pytest.raises(ValueError, match="grid"):
        search_pwlq(counts, edges, 8, 1, grid=1)


@pytest.mark.parametrize("lo", [0.0, -1e-30, -1e-9])
def test_one_sided_histogram_gives_valid_monotone_codebook(lo, gen):
    # Sigmoid-like outputs: nothing (or almost nothing) below zero.
    x = torch.sigmoid(torch.randn(20_000, generator=gen, dtype=torch.float64) * 3)
    counts, edges = _histogram(torch.cat([x, torch.tensor([lo], dtype=torch.float64)]))
    for bits in (4, 8):
        res = search_pwlq(counts, edges, bits, 2, symmetric=False)
        levels = res.codebook.levels()
        assert (levels[1:] > levels[:-1]).all()
        assert res.codebook.zero_code < -(2 ** (bits - 1)) + 2 ** (bits - 2)  # most codes go positive
        measured = quantization_mse(x, lambda t, cb=res.codebook: pwlq_fake_quantize(t, cb))
        assert res.mse == pytest.approx(measured, rel=0.05)
