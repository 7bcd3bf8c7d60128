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
