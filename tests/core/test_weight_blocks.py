"""The swap's cheap per-weight work equals the plain full-tensor computations it replaced.

* :func:`all_finite` (one ``aminmax`` pass) against ``torch.isfinite(x).all()``;
* ``QuantLinear.dequantized_rows`` against rows of ``dequantized_weight`` (every weight scheme);
* :func:`weight_sqnr_db` (blocks of rows) against ``sqnr_db`` of the whole dequantized weight;
* :func:`quantize` (in place after one copy) against the textbook expression.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ptq_protein.nn.convert import build_quant_linear, weight_sqnr_db
from ptq_protein.quant.metrics import BLOCK_VALUES, sqnr_db
from ptq_protein.quant.observers import all_finite
from ptq_protein.quant.uniform import choose_qparams, qrange, quantize
from ptq_protein.recipes.config import Granularity, QuantConfig, Scheme, TensorQuant

WEIGHT_SPECS = {
    "int8 per-channel symmetric": TensorQuant(bits=8, granularity=Granularity.PER_CHANNEL),
    "int8 per-channel asymmetric": TensorQuant(bits=8, symmetric=False, granularity=Granularity.PER_CHANNEL),
    "int4 per-tensor": TensorQuant(bits=4),
    "pwlq 8-bit": TensorQuant(bits=8, scheme=Scheme.PWLQ),
    "fp8 e4m3": TensorQuant(bits=8, scheme=Scheme.FP8, granularity=Granularity.PER_CHANNEL),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("n", [1, 7, 4096, 100_003])
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
def test_all_finite_equals_isfinite_all(dtype, n, bad):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    for pos in ({0, n // 2, n - 1} if bad is not None else {0}):
        y = x.clone()
        if bad is not None:
            y[pos] = bad
        assert all_finite(y) == bool(torch.isfinite(y).all())


def test_all_finite_edge_cases():
    assert all_finite(torch.empty(0))
    assert all_finite(torch.arange(5))  # integers are always finite
    assert not all_finite(torch.tensor([[1.0, 2.0], [float("nan"), 3.0]]).t())  # non-contiguous


@pytest.mark.parametrize("name", sorted(WEIGHT_SPECS))
def test_dequantized_rows_and_block_sqnr_equal_the_whole_weight(name):
    gen = torch.Generator().manual_seed(3)
    # more rows than one SQNR block holds, and a row count that does not divide evenly
    rows = BLOCK_VALUES // 96 + 5
    linear = nn.Linear(96, rows)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(rows, 96, generator=gen) * (1 + 5 * torch.rand(rows, 1, generator=gen)))
    q = build_quant_linear(linear, QuantConfig(weights=WEIGHT_SPECS[name], activations=None), None)
    whole = q.dequantized_weight(torch.float32)
    pieces = torch.cat([q.dequantized_rows(a, a + 1000) for a in range(0, rows, 1000)])
    assert torch.equal(pieces, whole)
    got = weight_sqnr_db(linear.weight.detach(), q)
    assert got == pytest.approx(sqnr_db(linear.weight.detach(), whole), rel=1e-12)
    assert 10 < got < 80  # a real quantization error, not 0 or inf


@pytest.mark.parametrize("bits,symmetric", [(8, True), (8, False), (4, True), (12, False)])
def test_quantize_equals_the_textbook_expression(bits, symmetric):
    gen = torch.Generator().manual_seed(bits)
    x = torch.randn(64, 33, generator=gen) * 3
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), -float("inf")
    lo, hi = x.nan_to_num(0.0, 0.0, 0.0).aminmax(dim=1, keepdim=True)
    scale, zp = choose_qparams(lo, hi, bits, symmetric)
    qmin, qmax = qrange(bits, symmetric)
    want = (torch.round(torch.nan_to_num(x, nan=0.0) / scale) + zp.float()).clamp(qmin, qmax)
    assert torch.equal(quantize(x, scale, zp, bits, symmetric).float(), want)
    # a lower-rank x broadcast against per-row parameters
    v = x[5].nan_to_num(0.0, 0.0, 0.0)
    want_b = (torch.round(v / scale) + zp.float()).clamp(qmin, qmax)
    assert torch.equal(quantize(v, scale, zp, bits, symmetric).float(), want_b)
    assert torch.isfinite(x).sum() == x.numel() - 3  # the input was not modified
