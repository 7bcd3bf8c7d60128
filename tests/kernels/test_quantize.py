"""Activation quantization kernels: codes, scales and zero points bit-identical to torch."""

import pytest
import torch
from kernel_testlib import dev

from ptq_protein.kernels.quantize import quantize_per_tensor, quantize_per_token
from ptq_protein.kernels.reference import SCALE_FLOOR

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _rows(gen, m, k, dtype):
    """Rows with different ranges and offsets (asymmetric ranges exercise the zero point), on the test device."""
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 8 + torch.randn(m, 1, generator=gen)
    return dev(x.to(dtype))


def _assert_same(a, b):
    for got, want in zip(a, b):
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [8, 4, 2])
def test_per_token_triton_equals_torch(dtype, symmetric, bits):
    gen = torch.Generator().manual_seed(bits + 10 * symmetric)
    x = _rows(gen, 11, 300, dtype)  # K=300 spans two interpreter blocks of 256
    _assert_same(quantize_per_token(x, bits, symmetric, backend="triton"),
                 quantize_per_token(x, bits, symmetric, backend="torch"))


def test_per_token_closed_form_and_half_steps():
    """amax = 127/8 gives scale 1/8 exactly; x = (k + 1/2)/8 must round half to even."""
    half = (torch.arange(-20, 20, dtype=torch.float32) + 0.5) / 8
    x = dev(torch.cat([half, torch.tensor([127 / 8, -3.0])]).reshape(1, -1))
    q, scale, zero = (t.cpu() for t in quantize_per_token(x, 8, True, backend="triton"))
    assert scale.item() == 0.125 and zero.item() == 0
    expected = torch.round(torch.arange(-20, 20, dtype=torch.float64) + 0.5)  # ..., -2, -2, 0, 0, 2, 2, ...
    assert torch.equal(q[0, :40].double(), expected)
    assert q[0, 40].item() == 127 and q[0, 41].item() == -24


def test_per_token_all_zero_row_and_asymmetric_range():
    x = dev(torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.5, 1.0, 2.0, 3.0]]))
    q, scale, zero = (t.cpu() for t in quantize_per_token(x, 8, False, backend="triton"))
    assert scale[0].item() == pytest.approx(SCALE_FLOOR) and torch.all(q[0] == zero[0])
    # the range [0, 3] is widened to include 0: scale 3/255, zero point -128
    assert scale[1].item() == pytest.approx(3 / 255, rel=1e-7) and zero[1].item() == -128
    assert q[1, -1].item() == 127


def test_per_token_matches_project_quantizer():
    """Same codes, scales and zero points as ptq_protein.quant.uniform.dynamic_per_token."""
    uniform = pytest.importorskip("ptq_protein.quant.uniform")
    gen = torch.Generator().manual_seed(4)
    for dtype in DTYPES:
        x = _rows(gen, 9, 70, dtype)
        for symmetric in (True, False):
            q, s, z = uniform.dynamic_per_token(x, 8, symmetric)
            _assert_same(quantize_per_token(x, 8, symmetric, backend="triton"), (q, s.reshape(-1), z.reshape(-1)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_per_tensor_triton_equals_torch(dtype, symmetric):
    gen = torch.Generator().manual_seed(8)
    x = _rows(gen, 6, 50, dtype)
    scale, zero = dev(torch.tensor(0.037), torch.tensor(0 if symmetric else -7, dtype=torch.int32))
    got = quantize_per_tensor(x, scale, zero, 8, symmetric, backend="triton")
    assert torch.equal(got, quantize_per_tensor(x, scale, zero, 8, symmetric, backend="torch"))


def test_per_tensor_half_steps_zero_point_and_specials():
    scale, zero = dev(torch.tensor(0.25), torch.tensor(3, dtype=torch.int32))
    x = dev(torch.tensor([[0.125, 0.375, -0.125, -0.375, 100.0, -100.0, float("inf"), float("-inf"), float("nan")]]))
    got = quantize_per_tensor(x, scale, zero, 8, symmetric=False, backend="triton")
    # round(0.5)=0, round(1.5)=2, round(-0.5)=-0, round(-1.5)=-2, then + 3; clamps; NaN encodes like 0
    assert got.tolist() == [[3, 5, 3, 1, 127, -128, 127, -128, 3]]
    assert torch.equal(got, quantize_per_tensor(x, scale, zero, 8, symmetric=False, backend="torch"))
    sym = quantize_per_tensor(x, scale, None, 8, symmetric=True, backend="triton")
    assert sym[0, 5].item() == -127  # the symmetric range drops -128


def test_non_contiguous_input_read_through_strides():
    gen = torch.Generator().manual_seed(9)
    x = _rows(gen, 40, 12, torch.float32)
    x_t = x.t()  # [12, 40], column-major
    _assert_same(quantize_per_token(x_t, backend="triton"), quantize_per_token(x_t.contiguous(), backend="triton"))
    scale = dev(torch.tensor(0.05))
    assert torch.equal(quantize_per_tensor(x_t, scale, backend="triton"),
                       quantize_per_tensor(x_t.contiguous(), scale, backend="triton"))
