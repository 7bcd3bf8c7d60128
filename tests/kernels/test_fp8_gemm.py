"""FP8 GEMM through torch._scaled_mm.

Equal to the exact product of the decoded codes, and to the recipe's simulation.
"""

import pytest
import torch

import ptq_protein as pp
from ptq_protein.kernels import fp8_linear
from ptq_protein.models.tiny import tiny_esm2
from ptq_protein.nn.modules import QuantLinear
from ptq_protein.quant.fp8 import fp8_per_token, fp8_quantize, fp8_scale


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("m, k, n", [(1, 7, 3), (33, 65, 17), (64, 128, 48)])
def test_fp8_linear_equals_the_float64_product_of_the_decoded_codes(fmt, m, k, n):
    gen = torch.Generator().manual_seed(m * k + n)
    x = torch.randn(m, k, generator=gen) * 3
    w = torch.randn(n, k, generator=gen) * 0.1
    bias = torch.randn(n, generator=gen)
    w_scale = fp8_scale(w.abs().amax(1), fmt)  # per output channel
    w_codes = fp8_quantize(w, w_scale[:, None], fmt)
    for x_codes, x_scale in ((fp8_quantize(x, fp8_scale(x.abs().max(), fmt), fmt), fp8_scale(x.abs().max(), fmt)),
                             fp8_per_token(x, fmt)):
        got = fp8_linear(x_codes, x_scale, w_codes, w_scale, bias)
        decoded_x = x_codes.double() * x_scale.double().reshape(-1, 1)
        decoded_w = w_codes.double() * w_scale.double()[:, None]
        want = decoded_x @ decoded_w.T + bias.double()
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6 * want.abs().max().item())


def test_fp8_linear_runs_the_w8a8_fp8_recipes_codes():
    model = tiny_esm2(seed=0)[0]
    qmodel = pp.quantize(model, "w8a8-fp8", calibration="casp14:2")
    lin = next(mod for mod in qmodel.modules() if isinstance(mod, QuantLinear))
    x = torch.randn(20, lin.in_features) * lin.input_quant.scale * 100
    with torch.no_grad():
        simulated = lin(x)
    codes = fp8_quantize(x, lin.input_quant.scale, "e4m3")
    got = fp8_linear(codes, lin.input_quant.scale, lin.weight_codes, lin.weight_scale.reshape(-1), lin.bias)
    torch.testing.assert_close(got, simulated, rtol=1e-5, atol=1e-5 * simulated.abs().max().item())


def test_fp8_linear_refuses_mismatched_shapes():
    codes = torch.zeros(4, 8).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"\[M, K\] and \[N, K\]"):
        fp8_linear(codes, torch.tensor(1.0), torch.zeros(3, 9).to(torch.float8_e4m3fn), torch.tensor(1.0))
