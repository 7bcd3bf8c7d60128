"""PWLQ builders: code layout on ONE b-bit code, 1-3 breakpoints, asymmetric sides."""

import pytest
import torch

from ptq_protein.quant.codebook import pwlq_dequantize, pwlq_fake_quantize, pwlq_quantize
from ptq_protein.quant.pwlq import asymmetric_pwlq, default_piece_codes, pwlq_from_breakpoints, symmetric_pwlq
from ptq_protein.quant.uniform import code_dtype, qrange


def test_symmetric_8bit_layout_closed_form():
    m, p = 4.0, 1.5
    cb = symmetric_pwlq(m, p, 8)
    assert (cb.code_lo, cb.code_hi) == ((-127, -64, 65), (-65, 64, 127))
    s_c, s_t = p / 64, (m - p) / 63
    assert cb.scale[1] == pytest.approx(s_c) and cb.scale[0] == pytest.approx(s_t) == cb.scale[2]
    codes = torch.tensor([0, 1, 64, 65, 100, 127, -64, -65, -127], dtype=torch.int32)
    expect = [0, s_c, p, p + s_t, p + 36 * s_t, m, -p, -p - s_t, -m]
    torch.testing.assert_close(pwlq_dequantize(codes, cb).double(), torch.tensor(expect, dtype=torch.float64),
                               atol=1e-6, rtol=0)


def test_symmetric_custom_centre_codes():
    cb = symmetric_pwlq(5.0, 2.0, 6, center_codes=20)  # qmax 31: centre 20, tails 11
    assert cb.code_hi[1] == 20 and cb.scale[1] == pytest.approx(0.1) and cb.scale[2] == pytest.approx(3.0 / 11)
    with pytest.raises(ValueError, match="center_codes"):
        symmetric_pwlq(5.0, 2.0, 6, center_codes=31)


@pytest.mark.parametrize("bits", [3, 4, 6, 8, 12, 16])
@pytest.mark.parametrize("n_breaks", [0, 1, 2, 3])
def test_codes_stay_within_stated_bits(bits, n_breaks, gen):
    m_neg, m_pos = 3.0, 5.0
    neg = [m_neg * (i + 1) / (n_breaks + 2) for i in range(n_breaks)]
    pos = [m_pos * (i + 1) / (n_breaks + 3) for i in range(n_breaks)]
    if qrange(bits, True)[1] < n_breaks + 1:
        with pytest.raises(ValueError, match="codes"):
            pwlq_from_breakpoints(neg, pos, m_neg, m_pos, bits)
        return
    cb = pwlq_from_breakpoints(neg, pos, m_neg, m_pos, bits)
    x = torch.cat([torch.randn(10_000, generator=gen) * 4, torch.tensor([1e30, -1e30, float("inf"), -float("inf")])])
    q = pwlq_quantize(x, cb)
    qmin, qmax = qrange(bits, False)
    assert q.dtype == code_dtype(bits)
    assert int(q.min()) >= qmin and int(q.max()) <= qmax
    assert int(q.min()) == cb.qmin == qmin and int(q.max()) == cb.qmax == qmax  # extremes hit the end codes
    levels = cb.levels().double()
    assert (levels[1:] > levels[:-1]).all()  # strictly monotone decode
    assert float(levels[0]) == pytest.approx(-m_neg) and float(levels[-1]) == pytest.approx(m_pos)
    assert float(pwlq_dequantize(torch.tensor([0]), cb)) == 0.0


@pytest.mark.parametrize("n_breaks", [1, 2, 3])
def test_breakpoints_are_levels_and_piece_codes_respected(n_breaks):
    pos = [0.5, 1.5, 2.5][:n_breaks]
    neg = [0.25, 1.0, 1.75][:n_breaks]
    counts = default_piece_codes(127, n_breaks + 1)
    neg_counts = default_piece_codes(128, n_breaks + 1)
    cb = pwlq_from_breakpoints(neg, pos, 2.0, 3.0, 8, (neg_counts, counts))
    levels = cb.levels().double()
    code_of = lambda c: levels[c - cb.qmin]  # noqa: E731
    cum = 0
    for b, n in zip(pos, counts):
        cum += n
        assert float(code_of(cum)) == pytest.approx(b, abs=1e-6)
    cum = 0
    for b, n in zip(neg, neg_counts):
        cum += n
        assert float(code_of(-cum)) == pytest.approx(-b, abs=1e-6)
    assert cb.qmin == -128 and cb.num_regions <= 2 * (n_breaks + 1)


def test_asymmetric_uses_extra_code():
    cb = asymmetric_pwlq(1.0, 0.25, 6.0, 2.0, 8)
    assert cb.qmin == -128 and cb.qmax == 127
    out = pwlq_fake_quantize(torch.tensor([-1.0, -0.25, 0.0, 2.0, 6.0, 100.0]), cb)
    torch.testing.assert_close(out, torch.tensor([-1.0, -0.25, 0.0, 2.0, 6.0, 6.0]), atol=1e-6, rtol=0)
    s_neg_centre = 0.25 / 64
    assert pwlq_dequantize(torch.tensor([-1]), cb).item() == pytest.approx(-s_neg_centre)
    assert pwlq_dequantize(torch.tensor([1]), cb).item() == pytest.approx(2.0 / 64)


def test_mirror_sides_default_to_symmetric_layout():
    assert pwlq_from_breakpoints([1.0], [1.0], 3.0, 3.0, 8) == symmetric_pwlq(3.0, 1.0, 8)
    assert pwlq_from_breakpoints([1.0], [1.2], 3.0, 3.0, 8).qmin == -128


@pytest.mark.parametrize(
    "args, match",
    [
        (([1.0, 0.5], [1.0], 3.0, 3.0, 8), "strictly increasing"),
        (([3.5], [1.0], 3.0, 3.0, 8), "strictly increasing"),
        (([0.0], [1.0], 3.0, 3.0, 8), "strictly increasing"),
        (([1.0], [1.0], -3.0, 3.0, 8), "strictly increasing"),
        (([0.1, 0.2, 0.3, 0.4], [1.0], 3.0, 3.0, 8), "at most 3"),
        (([1.0], [1.0], 3.0, 3.0, 8, ((60, 60), (64, 63))), "summing to 127"),
        (([1.0], [1.0], 3.0, 3.0, 8, ((127, 0), (64, 63))), "positive entries"),
        (([1.0], [1.0], 3.0, 3.0, 2), "one code per piece"),
        (([1.0], [1.0], 3.0, 3.0, 8, None, True, 127), "one code per piece"),
    ],
)
def test_builder_errors(args, match):
    with pytest.raises(ValueError, match=match):
        pwlq_from_breakpoints(*args)


def test_zero_code_moves_codes_between_sides():
    # GELU-like range: 29 negative codes (-128..-100), zero at -99, 226 positive codes.
    cb = asymmetric_pwlq(0.17, 0.05, 8.0, 2.0, 8, zero_code=-99)
    assert cb.zero_code == -99 and (cb.qmin, cb.qmax) == (-128, 127)
    assert abs(float(pwlq_dequantize(torch.tensor([-99]), cb))) < 1e-9
    levels = cb.levels().double()
    assert (levels[1:] > levels[:-1]).all()
    assert float(levels[0]) == pytest.approx(-0.17) and float(levels[-1]) == pytest.approx(8.0)
    assert float(levels[-99 + 113 + 128]) == pytest.approx(2.0, abs=1e-6)  # 113 = ceil(226 / 2) centre codes
    x = torch.linspace(-0.2, 9.0, 5001)
    assert pwlq_quantize(x, cb).min() == -128 and pwlq_quantize(torch.tensor([float("nan")]), cb).item() == -99


@pytest.mark.parametrize("zero,breaks", [(-40, ((0.3,), (1.1,))), (10, ((0.5, 0.9), (0.2, 2.0))), (0, ((2.5,), (0.1,))),
                                         (5, ((0.05, 0.06), (3.0,)))])  # the last: the pooled step passes 0.06
def test_shared_centre_step_is_one_uniform_grid(zero, breaks):
    """Both centre pieces on the pooled step: one region decoding ``step * (q - zero)``, the tails unchanged."""
    from ptq_protein.quant.pwlq import shared_centre_step

    neg_b, pos_b = breaks
    qmin, qmax = qrange(8, False)
    inner = ((40,) + (20,) * (len(neg_b) - 1), (50,) + (30,) * (len(pos_b) - 1))  # centre, middle pieces; tail: rest
    counts = (inner[0] + (zero - qmin - sum(inner[0]),), inner[1] + (qmax - zero - sum(inner[1]),))
    cb = shared_centre_step(neg_b, pos_b, 3.0, 4.0, 8, counts, zero)
    plain = pwlq_from_breakpoints(neg_b, pos_b, 3.0, 4.0, 8, counts, extra_negative_code=True, zero_code=zero)
    assert len(cb.code_lo) == len(plain.code_lo) - 1  # the two centre pieces became one region
    centre = next(r for r in range(len(cb.code_lo)) if cb.code_lo[r] <= zero <= cb.code_hi[r])
    assert (cb.code_lo[centre], cb.code_hi[centre]) == (zero - counts[0][0], zero + counts[1][0])
    pooled = (neg_b[0] + pos_b[0]) / (counts[0][0] + counts[1][0])
    step = float(torch.tensor(pooled, dtype=torch.float32))
    if step * counts[0][0] >= (neg_b[1:] or (3.0,))[0] or step * counts[1][0] >= (pos_b[1:] or (4.0,))[0]:
        step = float(torch.tensor(min(neg_b[0] / counts[0][0], pos_b[0] / counts[1][0]), dtype=torch.float32))
    q = torch.arange(cb.code_lo[centre], cb.code_hi[centre] + 1)
    torch.testing.assert_close(pwlq_dequantize(q, cb).double(), step * (q.double() - zero), atol=1e-6, rtol=1e-6)
    assert pwlq_dequantize(torch.tensor([qmin, qmax]), cb).tolist() == pytest.approx([-3.0, 4.0], rel=1e-6)
