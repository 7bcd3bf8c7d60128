"""Uniform affine quantization against closed forms and float64 references."""

import math

import pytest
import torch

from ptq_protein.quant.uniform import (
    SCALE_FLOOR,
    choose_qparams,
    code_dtype,
    dequantize,
    dynamic_per_token,
    fake_quantize,
    per_channel_minmax,
    qrange,
    quantize,
)

ALL_BITS = list(range(2, 17))


@pytest.mark.parametrize("bits", ALL_BITS)
def test_qrange_closed_form(bits):
    q = 2 ** (bits - 1)
    assert qrange(bits, True) == (-(q - 1), q - 1)
    assert qrange(bits, False) == (-q, q - 1)
    assert code_dtype(bits) == (torch.int8 if bits <= 8 else torch.int16)


@pytest.mark.parametrize("bad", [0, 1, 17, 32, -4, 8.0, True, "8", None])
def test_invalid_bits_name_value_and_range(bad):
    with pytest.raises(ValueError, match=r"bits=.*\[2, 16\]"):
        qrange(bad, True)
    with pytest.raises(ValueError, match=r"\[2, 16\]"):
        choose_qparams(-1.0, 1.0, bad, False)


def test_symmetric_8bit_closed_form():
    x = torch.tensor([-1.0, 0.0, 0.5, 1.0])
    scale, zp = choose_qparams(x.min(), x.max(), 8, symmetric=True)
    assert scale.dtype == torch.float32 and zp.dtype == torch.int32
    assert float(scale) == pytest.approx(1 / 127, rel=1e-7) and int(zp) == 0
    q = quantize(x, scale, zp, 8, True)
    assert q.dtype == torch.int8
    assert q.tolist() == [-127, 0, 64, 127]  # 63.5 rounds half to even
    torch.testing.assert_close(dequantize(q, scale, zp), torch.tensor([-1.0, 0.0, 64 / 127, 1.0]))


def test_asymmetric_8bit_closed_form():
    # Range [0, 3] (zero included): scale 3/255, zp = -128, codes round(x * 85) - 128.
    x = torch.tensor([0.0, 1.0, 2.0, 3.0])
    scale, zp = choose_qparams(x.min(), x.max(), 8, symmetric=False)
    assert float(scale) == pytest.approx(3 / 255, rel=1e-7) and int(zp) == -128
    assert quantize(x, scale, zp, 8, False).tolist() == [-128, -43, 42, 127]
    # Range [-1, 3]: scale 4/255, zp = -128 - round(-63.75) = -64; 0 is exact.
    scale, zp = choose_qparams(-1.0, 3.0, 8, symmetric=False)
    assert int(zp) == -64
    q = quantize(torch.tensor([-1.0, 0.0, 3.0]), scale, zp, 8, False)
    assert q.tolist() == [-128, -64, 127]
    assert float(dequantize(q, scale, zp)[1]) == 0.0


def test_positive_only_range_widened_to_zero():
    scale, zp = choose_qparams(2.0, 4.0, 4, symmetric=False)  # [0, 4] over 15 steps
    assert float(scale) == pytest.approx(4 / 15, rel=1e-7) and int(zp) == -8


@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("symmetric", [True, False])
def test_round_trip_within_half_step_every_width(bits, symmetric, gen):
    x = torch.randn(4096, generator=gen) * 3 + (0.0 if symmetric else 1.5)
    scale, zp = choose_qparams(x.min(), x.max(), bits, symmetric)
    q = quantize(x, scale, zp, bits, symmetric)
    qmin, qmax = qrange(bits, symmetric)
    assert q.dtype == code_dtype(bits)
    assert int(q.min()) >= qmin and int(q.max()) <= qmax
    err = (dequantize(q, scale, zp) - x).abs().max()
    assert float(err) <= float(scale) * (0.5 + 1e-3) + 1e-6
    # Independent float64 reference of the code formula.
    ref = torch.clamp(torch.round(x.double() / float(scale)) + int(zp), qmin, qmax)
    assert (q.long() != ref.long()).float().mean() < 1e-3


@pytest.mark.parametrize("symmetric", [True, False])
def test_per_channel_params_broadcast(symmetric):
    w = torch.tensor([[-2.0, 1.0, 0.5, 0.0], [0.25, 0.5, -0.125, 0.0], [1.0, 3.0, 2.0, -1.0]])
    lo, hi = per_channel_minmax(w, axis=0)
    assert lo.shape == (3, 1) and hi.shape == (3, 1)
    torch.testing.assert_close(lo.flatten(), torch.tensor([-2.0, -0.125, -1.0]))
    torch.testing.assert_close(hi.flatten(), torch.tensor([1.0, 0.5, 3.0]))
    scale, zp = choose_qparams(lo, hi, 8, symmetric)
    assert scale.shape == (3, 1)
    if symmetric:
        torch.testing.assert_close(scale.flatten(), torch.tensor([2.0, 0.5, 3.0]) / 127)
    else:
        torch.testing.assert_close(scale.flatten(), torch.tensor([3.0, 0.625, 4.0]) / 255)
    q = quantize(w, scale, zp, 8, symmetric)
    for r in range(3):  # each row equals its own per-tensor quantization
        s_r, z_r = choose_qparams(w[r].min(), w[r].max(), 8, symmetric)
        assert torch.equal(q[r], quantize(w[r], s_r, z_r, 8, symmetric))
    assert (dequantize(q, scale, zp) - w).abs().le(scale / 2 + 1e-7).all()


def test_per_channel_other_axis_and_errors():
    w = torch.arange(24.0).reshape(2, 3, 4) - 10
    lo, hi = per_channel_minmax(w, axis=-1)
    assert lo.shape == (1, 1, 4)
    torch.testing.assert_close(lo.flatten(), w.amin(dim=(0, 1)))
    with pytest.raises(ValueError, match="axis=3"):
        per_channel_minmax(w, axis=3)
    with pytest.raises(ValueError, match="scalar"):
        per_channel_minmax(torch.tensor(1.0), axis=0)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [2, 4, 8, 16])
def test_dynamic_per_token(symmetric, bits, gen):
    x = torch.randn(2, 5, 16, generator=gen) * torch.arange(1, 11.0).reshape(2, 5, 1)
    q, scale, zp = dynamic_per_token(x, bits, symmetric)
    assert q.shape == x.shape and scale.shape == (2, 5, 1) and zp.shape == (2, 5, 1)
    for i in range(2):
        for t in range(5):
            s_ref, z_ref = choose_qparams(x[i, t].min(), x[i, t].max(), bits, symmetric)
            assert float(scale[i, t, 0]) == float(s_ref) and int(zp[i, t, 0]) == int(z_ref)
    qmin, qmax = qrange(bits, symmetric)
    assert int(q.min()) >= qmin and int(q.max()) <= qmax
    assert ((dequantize(q, scale, zp) - x).abs() <= scale * 0.5001 + 1e-6).all()
    with pytest.raises(ValueError, match="last dim"):
        dynamic_per_token(torch.zeros(3, 0), bits, symmetric)


@pytest.mark.parametrize("bits", [4, 8])
def test_mse_matches_uniform_noise_model(bits, gen):
    # Uniform data over the full range: MSE = Delta^2 / 12 (Bennett).
    x = torch.rand(200_000, generator=gen, dtype=torch.float64) * 2 - 1
    scale, zp = choose_qparams(-1.0, 1.0, bits, True)
    mse = float(((fake_quantize(x, scale, zp, bits, True) - x) ** 2).mean())
    assert mse == pytest.approx(float(scale) ** 2 / 12, rel=0.02)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [2, 8, 16])
def test_constant_inputs(symmetric, bits):
    zeros = torch.zeros(7)
    s, z = choose_qparams(zeros.min(), zeros.max(), bits, symmetric)
    assert float(s) == pytest.approx(SCALE_FLOOR) and float(s) > 0 and not math.isnan(float(s))
    assert torch.equal(fake_quantize(zeros, s, z, bits, symmetric), zeros)
    for c in (0.3, -2.5, 1e-20, 7e5):
        x = torch.full((5,), c)
        s, z = choose_qparams(x.min(), x.max(), bits, symmetric)
        assert float(s) > 0
        err = (fake_quantize(x, s, z, bits, symmetric) - x).abs().max()
        assert float(err) <= float(s) * 1.0001


def test_quantize_time_non_finite_behaviour():
    scale, zp = choose_qparams(-1.0, 3.0, 8, False)
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5])
    q = quantize(x, scale, zp, 8, False)
    assert q.tolist()[:3] == [int(zp), 127, -128]  # NaN -> code of 0; +-Inf clamp
    out = fake_quantize(x, scale, zp, 8, False)
    assert math.isnan(float(out[0]))  # NaN propagates in the simulated path
    assert float(out[1]) == pytest.approx(3.0, abs=float(scale))
    assert float(out[2]) == pytest.approx(-1.0, abs=float(scale))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_choose_qparams_rejects_non_finite(bad):
    with pytest.raises(ValueError, match="non-finite"):
        choose_qparams(torch.tensor([bad, 0.0]), torch.tensor([1.0, 1.0]), 8, True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_fake_quantize_keeps_dtype(dtype, gen):
    x = torch.randn(64, generator=gen).to(dtype)
    s, z = choose_qparams(x.min().float(), x.max().float(), 8, True)
    out = fake_quantize(x, s, z, 8, True)
    assert out.dtype == dtype
    ref = fake_quantize(x.float(), s, z, 8, True)
    torch.testing.assert_close(out.float(), ref, atol=float(s), rtol=1e-2)
