"""MSE and SQNR helpers against closed forms."""

import math

import pytest
import torch

from ptq_protein.quant.metrics import quantization_mse, sqnr_db


def test_quantization_mse_closed_form():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert quantization_mse(x, lambda t: t + 0.5) == 0.25
    with pytest.raises(ValueError, match="shape"):
        quantization_mse(x, lambda t: t[:2])


def test_sqnr_closed_form():
    x = torch.tensor([3.0, 4.0])  # signal power sum 25
    assert sqnr_db(x, x + torch.tensor([0.5, 0.0])) == pytest.approx(10 * math.log10(25 / 0.25))
    assert sqnr_db(x, x) == math.inf
    assert sqnr_db(torch.zeros(2), torch.ones(2)) == -math.inf
    with pytest.raises(ValueError, match="shapes"):
        sqnr_db(x, x[:1])


def test_sqnr_over_several_chunks_equals_the_whole_tensor_float64_value():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, (1 << 18) + 7, generator=gen)  # three chunks and a ragged tail
    xq = (x * 31).round() / 31
    x64 = x.double()
    want = 10 * math.log10(float((x64 ** 2).sum()) / float(((xq.double() - x64) ** 2).sum()))
    assert sqnr_db(x, xq) == pytest.approx(want, rel=1e-12)
