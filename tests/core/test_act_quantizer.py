"""The fast fake-quant path of static quantizers equals decode(encode(x)) bit for bit."""

import pytest
import torch

from ptq_protein.nn.modules import ActQuantizer
from ptq_protein.quant.pwlq import asymmetric_pwlq, pwlq_from_breakpoints, symmetric_pwlq
from ptq_protein.recipes.config import Scheme, TensorQuant


def _inputs(dtype):
    torch.manual_seed(0)
    x = torch.cat([torch.randn(20000) * 3, torch.randn(200) * 40,
                   torch.tensor([0.0, float("nan"), float("inf"), -float("inf")])])
    return x.to(dtype)


def _reference(q, x):
    codes, params = q.encode(x)
    out = q.decode(codes, params)
    return torch.where(torch.isnan(x), x.to(out.dtype), out).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("cb", [symmetric_pwlq(10.0, 2.0, 8), asymmetric_pwlq(3.0, 1.0, 20.0, 4.0, 8),
                                asymmetric_pwlq(3.0, 1.0, 20.0, 4.0, 4),
                                pwlq_from_breakpoints([1.0, 3.0], [0.5, 2.0, 6.0], 9.0, 30.0, 8)])
def test_pwlq_fast_path_is_exact(cb, dtype):
    spec = TensorQuant(bits=cb.bits, scheme=Scheme.PWLQ, symmetric=False)
    q = ActQuantizer(spec, codebook=cb)
    x = _inputs(dtype)
    assert torch.allclose(q(x), _reference(q, x), equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("symmetric, scale, zp", [(True, 0.05, 0), (False, 0.07, -13), (False, 1e-3, 100)])
def test_uniform_fast_path_is_exact(dtype, symmetric, scale, zp):
    spec = TensorQuant(bits=8, symmetric=symmetric)
    q = ActQuantizer(spec, scale=torch.tensor(scale), zero_point=torch.tensor(zp))
    x = _inputs(dtype)
    assert torch.allclose(q(x), _reference(q, x), equal_nan=True, atol=0, rtol=0)
