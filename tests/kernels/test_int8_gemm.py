"""W8A8 GEMM: exact int32 accumulators and the fused epilogue, both backends.

Without a GPU the Triton backend runs in the interpreter (tests/conftest.py
sets TRITON_INTERPRET=1), so shapes stay small except one large-K case; with
one, the same tests run the compiled kernels on CUDA.
"""

import pytest
import torch
from kernel_testlib import DEVICE, assert_epilogue_close, codes, dev, exact_product, linear_ref64

from ptq_protein.kernels.int8_gemm import int8_linear, int8_matmul_int32

BACKENDS = ("triton", "torch")
# (M, K, N): a single token, odd sizes that straddle tiles, a large K.
SHAPES = [(1, 33, 33), (37, 64, 40), (3, 4096, 5)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES + [(17, 16, 8)])
def test_accumulators_exact(shape, backend):
    m, k, n = shape
    gen = torch.Generator().manual_seed(m * 1000 + k + n)
    a, b = codes(gen, (m, k)), codes(gen, (n, k))
    got = int8_matmul_int32(*dev(a, b), backend=backend)
    assert got.dtype == torch.int32 and got.device.type == DEVICE.type
    assert torch.equal(got.cpu().long(), exact_product(a, b))


@pytest.mark.parametrize("backend", BACKENDS)
def test_accumulators_extreme_codes(backend):
    """All -128 (and one sign flipped) over K=4096: |acc| = 2^26, the largest int8 products."""
    a = torch.full((2, 4096), -128, dtype=torch.int8)
    b = torch.full((3, 4096), -128, dtype=torch.int8)
    b[1] = 127
    got = int8_matmul_int32(*dev(a, b), backend=backend).cpu()
    assert got[0, 0].item() == 128 * 128 * 4096
    assert got[0, 1].item() == -128 * 127 * 4096
    assert torch.equal(got.long(), exact_product(a, b))


def _operands(gen, m, k, n, per_token, with_zero, with_bias):
    x_q, w_q = codes(gen, (m, k)), codes(gen, (n, k), -127, 127)
    x_scale = (torch.rand(m, generator=gen) * 0.02 + 1e-3) if per_token else torch.tensor(0.0137)
    x_zero = None
    if with_zero:
        x_zero = torch.randint(-20, 21, (m,) if per_token else (), dtype=torch.int32, generator=gen)
    w_scale = torch.rand(n, generator=gen) * 0.01 + 1e-4
    bias = torch.randn(n, generator=gen) * 3 if with_bias else None
    return x_q, x_scale, x_zero, w_q, w_scale, bias


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_linear_matches_float64(shape, out_dtype, backend):
    m, k, n = shape
    gen = torch.Generator().manual_seed(7 + m + k)
    ops = _operands(gen, m, k, n, per_token=True, with_zero=True, with_bias=True)
    y = int8_linear(*dev(*ops), out_dtype=out_dtype, backend=backend)
    assert y.dtype == out_dtype and y.shape == (m, n)
    assert_epilogue_close(y, *linear_ref64(*ops))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("with_zero", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_scale_zero_bias_modes(per_token, with_zero, with_bias, backend):
    gen = torch.Generator().manual_seed(11)
    ops = _operands(gen, 19, 48, 24, per_token, with_zero, with_bias)
    y = int8_linear(*dev(*ops), backend=backend)
    assert_epilogue_close(y, *linear_ref64(*ops))


def test_precomputed_colsum_and_zero_zero_point_agree():
    gen = torch.Generator().manual_seed(3)
    x_q, x_scale, x_zero, w_q, w_scale, bias = dev(*_operands(gen, 9, 40, 18, True, True, True))
    colsum = w_q.sum(1, dtype=torch.int32)
    given = int8_linear(x_q, x_scale, x_zero, w_q, w_scale, bias, w_colsum=colsum, backend="triton")
    computed = int8_linear(x_q, x_scale, x_zero, w_q, w_scale, bias, backend="triton")
    assert torch.equal(given, computed)
    # a zero point of 0 and no zero point are the same linear
    zeros = torch.zeros(9, dtype=torch.int32, device=DEVICE)
    assert torch.equal(
        int8_linear(x_q, x_scale, zeros, w_q, w_scale, bias, backend="triton"),
        int8_linear(x_q, x_scale, None, w_q, w_scale, bias, backend="triton"),
    )


def test_non_contiguous_operands_read_through_strides():
    gen = torch.Generator().manual_seed(5)
    x_q, x_scale, x_zero, w_q, w_scale, bias = dev(*_operands(gen, 21, 40, 30, True, True, False))
    x_t = x_q.t().contiguous().t()  # column-major view
    w_s = torch.stack([w_q, -w_q], dim=2).reshape(30, 80)[:, ::2]  # stride 2 along K
    assert torch.equal(w_s, w_q) and not x_t.is_contiguous() and not w_s.is_contiguous()
    ref = int8_linear(x_q, x_scale, x_zero, w_q, w_scale, bias, backend="triton")
    got = int8_linear(x_t, x_scale, x_zero, w_s, w_scale, bias, backend="triton")
    assert torch.equal(got, ref)
    assert torch.equal(int8_matmul_int32(x_t, w_s).cpu().long(), exact_product(x_q.cpu(), w_q.cpu()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch(backend):
    x_q, x_scale, w_q, w_scale = dev(torch.zeros(0, 8, dtype=torch.int8), torch.ones(0),
                                     torch.ones(4, 8, dtype=torch.int8),
                                     torch.ones(4))
    y = int8_linear(x_q, x_scale, None, w_q, w_scale, backend=backend)
    assert y.shape == (0, 4)
