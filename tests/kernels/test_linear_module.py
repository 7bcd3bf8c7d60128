"""Int8Linear: the W8A8 nn.Linear stand-in used by the benchmark."""

import pytest
import torch
from kernel_testlib import DEVICE
from torch import nn

from ptq_protein.kernels.int8_gemm import int8_linear
from ptq_protein.kernels.linear_module import Int8Linear
from ptq_protein.kernels.quantize import quantize_per_token


def _linear(bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(48, 40, bias=bias).to(DEVICE)


@pytest.mark.parametrize("act_symmetric", [True, False])
def test_forward_is_the_kernel_composition(act_symmetric):
    lin = _linear()
    mod = Int8Linear.from_float(lin, act_symmetric=act_symmetric)
    x = torch.randn(3, 7, 48, device=DEVICE)  # any leading dims
    y = mod(x)
    assert y.shape == (3, 7, 40) and y.dtype == x.dtype
    x_q, x_scale, x_zero = quantize_per_token(x.reshape(-1, 48), 8, act_symmetric)
    w_q, w_scale, _ = quantize_per_token(lin.weight.detach(), 8, True)
    want = int8_linear(x_q, x_scale, None if act_symmetric else x_zero, w_q, w_scale, lin.bias.detach())
    assert torch.equal(y.reshape(-1, 40), want)


def test_close_to_the_float_layer_and_original_untouched():
    lin = _linear(bias=False, seed=1)
    before = lin.weight.detach().clone()
    mod = Int8Linear.from_float(lin)
    x = torch.randn(16, 48, device=DEVICE)
    y, ref = mod(x), lin(x).detach()
    # 8-bit per-token x per-channel: a few per mille of the output scale
    assert (y - ref).abs().max().item() < 0.02 * ref.abs().max().item()
    assert torch.equal(lin.weight, before) and mod.bias is None
    assert mod.w_q.dtype == torch.int8 and torch.equal(mod.w_colsum, mod.w_q.sum(1, dtype=torch.int32))


def test_backends_agree_and_half_precision_input():
    lin = _linear(seed=2)
    x = torch.randn(5, 48, device=DEVICE).to(torch.bfloat16)
    a = Int8Linear.from_float(lin, backend="triton")(x)
    b = Int8Linear.from_float(lin, backend="torch")(x)
    assert a.dtype == torch.bfloat16
    torch.testing.assert_close(a, b, rtol=2.0**-7, atol=1e-3)


def test_rejects_non_linear_and_integer_input():
    with pytest.raises(ValueError, match="needs an nn.Linear"):
        Int8Linear.from_float(nn.Conv1d(2, 2, 1))
    with pytest.raises(ValueError, match="expects float16, bfloat16 or float32"):
        Int8Linear.from_float(_linear())(torch.zeros(2, 48, dtype=torch.int64, device=DEVICE))
