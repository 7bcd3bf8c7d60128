"""PiecewiseCodebook: encode/decode conventions, serialisation, the uniform special case."""

import json
import math

import pytest
import torch

from ptq_protein.quant.codebook import (
    PiecewiseCodebook,
    codebook_step_function,
    pwlq_dequantize,
    pwlq_fake_quantize,
    pwlq_quantize,
    uniform_codebook,
)
from ptq_protein.quant.pwlq import symmetric_pwlq
from ptq_protein.quant.uniform import choose_qparams, fake_quantize, quantize


def _nearest_level(x: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Brute-force nearest level (float64) with the distance to the runner-up."""
    d = (x.double()[:, None] - levels.double()[None, :]).abs()
    best = d.topk(2, dim=1, largest=False)
    return levels.double()[best.indices[:, 0]], best.values[:, 1] - best.values[:, 0]


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [2, 4, 8, 12, 16])
def test_one_region_codebook_is_uniform(symmetric, bits, gen):
    x = torch.randn(50_000, generator=gen) * 2 + (0.0 if symmetric else 0.7)
    scale, zp = choose_qparams(x.min(), x.max(), bits, symmetric)
    cb = uniform_codebook(float(scale), int(zp), bits, symmetric)
    assert cb.num_regions == 1
    q_u, q_c = quantize(x, scale, zp, bits, symmetric), pwlq_quantize(x, cb)
    if symmetric:  # offset 0: the same float32 operations, bit-exact
        assert torch.equal(q_u, q_c)
        assert torch.equal(fake_quantize(x, scale, zp, bits, symmetric), pwlq_fake_quantize(x, cb))
    else:  # (x - offset) / s vs x / s + zp differ only at float32 near-ties
        diff = (q_u.int() - q_c.int()).abs()
        assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 1e-3
        torch.testing.assert_close(pwlq_fake_quantize(x, cb), fake_quantize(x, scale, zp, bits, symmetric),
                                   atol=float(scale) * 1.001, rtol=0)


def test_encoder_is_nearest_level_and_step_function_agrees(gen):
    cb = symmetric_pwlq(4.0, 1.2, 6)
    x = torch.empty(20_000).uniform_(-5, 5, generator=gen)
    xq = pwlq_fake_quantize(x, cb)
    ref, gap = _nearest_level(x, cb.levels())
    ok = gap > 1e-5  # ignore exact ties
    torch.testing.assert_close(xq.double()[ok], ref[ok], atol=1e-6, rtol=0)
    levels, bounds = codebook_step_function(cb)
    idx = torch.searchsorted(bounds, x.double(), right=True)
    torch.testing.assert_close(levels[idx][ok], xq.double()[ok], atol=1e-6, rtol=0)


def test_region_selection_by_thresholds():
    cb = symmetric_pwlq(4.0, 1.0, 8)  # centre step 1/64, tail step 3/63
    s_t = 3.0 / 63
    thr = cb.thresholds[1]
    assert thr == pytest.approx(1.0 + s_t / 2, rel=1e-6)
    just_below = torch.nextafter(torch.tensor(thr), torch.tensor(-10.0))
    x = torch.stack([torch.tensor(1.0), just_below, torch.tensor(thr), torch.tensor(1.0 + 0.49 * s_t)])
    q = pwlq_quantize(x, cb).tolist()
    assert q == [64, 64, 65, 64]  # x == threshold belongs to the upper region
    neg = pwlq_quantize(-x, cb).tolist()
    assert neg[0] == -64 and neg[3] == -64


def test_non_finite_encode_and_decode():
    cb = symmetric_pwlq(2.0, 0.5, 8)
    x = torch.tensor([float("nan"), float("inf"), -float("inf")])
    assert pwlq_quantize(x, cb).tolist() == [0, 127, -127]
    out = pwlq_fake_quantize(x, cb)
    assert math.isnan(float(out[0])) and float(out[1]) == pytest.approx(2.0) and float(out[2]) == pytest.approx(-2.0)


def test_dequantize_rejects_codes_outside_range():
    cb = symmetric_pwlq(2.0, 0.5, 8)
    with pytest.raises(ValueError, match="outside"):
        pwlq_dequantize(torch.tensor([-128], dtype=torch.int8), cb)


def test_to_dict_round_trip_and_kernel_tensors():
    cb = symmetric_pwlq(3.0, 1.1, 8)
    data = json.loads(json.dumps(cb.to_dict()))
    assert PiecewiseCodebook.from_dict(data) == cb
    assert cb.offsets().dtype == torch.float32 and cb.scales().shape == (3,)
    assert cb.code_lo_tensor().dtype == torch.int32 and cb.code_hi_tensor().tolist() == [-65, 64, 127]
    assert cb.thresholds_tensor().shape == (2,) and cb.thresholds_tensor().dtype == torch.float32
    # Stored parameters are float32-exact, so kernels receive exactly these numbers.
    assert cb.scales().double().tolist() == list(cb.scale)
    with pytest.raises(ValueError, match="version"):
        PiecewiseCodebook.from_dict({**data, "version": 99})
    with pytest.raises(ValueError, match="missing"):
        PiecewiseCodebook.from_dict({"version": data["version"], "bits": 8})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(code_lo=(-127, 0), code_hi=(-2, 127)), "contiguous"),
        (dict(code_lo=(-200,), code_hi=(127,), offset=(0.0,), scale=(1.0,), thresholds=()), "exceed"),
        (dict(thresholds=()), "need 1 thresholds"),
        (dict(code_lo=(-127, 0, 1), code_hi=(-1, 0, 127), offset=(0.0,) * 3, scale=(1.0,) * 3,
              thresholds=(0.5, -0.5)), "ascending"),
        (dict(scale=(0.0, 1.0)), "positive scale"),
        (dict(code_lo=(-127, 5), code_hi=(4, 3)), "empty"),
    ],
)
def test_codebook_validation(kwargs, match):
    base = dict(bits=8, code_lo=(-127, 1), code_hi=(0, 127), offset=(0.0, 0.0), scale=(1.0, 1.0), thresholds=(0.5,))
    with pytest.raises(ValueError, match=match):
        PiecewiseCodebook(**{**base, **kwargs})
    with pytest.raises(ValueError, match="bits"):
        PiecewiseCodebook(**{**base, "bits": 17})


def test_codebook_rejects_non_monotone_decode():
    with pytest.raises(ValueError, match="increase with the code"):
        PiecewiseCodebook(8, (-128, 0), (-1, 127), (5.0, 0.0), (1.0, 1.0), (0.0,))
