"""Int4 packing and the W4A8 GEMM (nibbles unpacked in the kernel)."""

import pytest
import torch
from kernel_testlib import assert_epilogue_close, codes, dev, linear_ref64

from ptq_protein.kernels.int4_gemm import int4_linear
from ptq_protein.kernels.packing import pack_int4, unpack_int4

BACKENDS = ("triton", "torch")


def test_pack_layout_low_nibble_first():
    w = torch.tensor([[1, -1, 7, -8, 0]], dtype=torch.int8)
    packed = pack_int4(w)
    # byte j: w[2j] in bits 0-3, w[2j+1] in bits 4-7, two's complement; odd K pads a zero nibble
    assert packed.tolist() == [[0xF1, 0x87, 0x00]]
    assert packed.dtype == torch.uint8


@pytest.mark.parametrize("k", [1, 2, 33, 64])
def test_pack_unpack_round_trip(k):
    gen = torch.Generator().manual_seed(k)
    w = codes(gen, (5, k), -8, 7)
    packed = pack_int4(dev(w))
    assert packed.shape == (5, (k + 1) // 2)
    assert torch.equal(unpack_int4(packed, k).cpu(), w)


def test_every_nibble_value_survives():
    w = torch.arange(-8, 8, dtype=torch.int8).reshape(1, 16)
    assert torch.equal(unpack_int4(pack_int4(w), 16), w)
    assert torch.equal(unpack_int4(pack_int4(w.flip(1)), 16), w.flip(1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 33, 33), (37, 64, 40), (3, 4096, 5)])
def test_int4_linear_matches_float64(shape, out_dtype, backend):
    m, k, n = shape
    gen = torch.Generator().manual_seed(m + 3 * k + n)
    x_q, w_q = codes(gen, (m, k)), codes(gen, (n, k), -8, 7)
    x_scale = torch.rand(m, generator=gen) * 0.05 + 1e-3
    x_zero = torch.randint(-9, 10, (m,), dtype=torch.int32, generator=gen)
    w_scale = torch.rand(n, generator=gen) * 0.1 + 1e-3
    bias = torch.randn(n, generator=gen)
    y = int4_linear(*dev(x_q, x_scale, x_zero, pack_int4(w_q), w_scale), k, dev(bias), out_dtype=out_dtype,
                    backend=backend)
    assert y.dtype == out_dtype
    assert_epilogue_close(y, *linear_ref64(x_q, x_scale, x_zero, w_q, w_scale, bias))


def test_int4_equals_int8_on_the_same_codes():
    """The W4A8 kernel is the W8A8 kernel on unpacked weights, to the bit."""
    from ptq_protein.kernels.int8_gemm import int8_linear

    gen = torch.Generator().manual_seed(2)
    x_q, w_q = dev(codes(gen, (13, 47)), codes(gen, (22, 47), -7, 7))
    x_scale, w_scale = dev(torch.tensor(0.02), torch.rand(22, generator=gen))
    packed = pack_int4(w_q)
    strided = torch.stack([packed, packed], dim=2).reshape(22, -1)[:, ::2]  # non-contiguous packed view
    a = int4_linear(x_q, x_scale, None, strided, w_scale, 47, backend="triton")
    b = int8_linear(x_q, x_scale, None, w_q, w_scale, backend="triton")
    assert torch.equal(a, b)
    zero, colsum = dev(torch.tensor(-5, dtype=torch.int32), w_q.cpu().sum(1, dtype=torch.int32))
    a = int4_linear(x_q, x_scale, zero, packed, w_scale, 47, w_colsum=colsum, backend="triton")
    assert torch.equal(a, int8_linear(x_q, x_scale, zero, w_q, w_scale, backend="triton"))
