"""SmoothQuant's factors against their closed form."""

import pytest
import torch

from ptq_protein.quant.smoothing import channel_max_ratio, smoothing_factors


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.85, 1.0])
def test_closed_form(alpha):
    a = torch.tensor([100.0, 1.0, 4.0, 0.0])
    w = torch.tensor([0.5, 2.0, 1.0, 1.0])
    s = smoothing_factors(a, w, alpha)
    expected = torch.tensor([max(float(ai), 1e-5) ** alpha / float(wi) ** (1 - alpha) for ai, wi in zip(a, w)])
    assert torch.allclose(s, expected.clamp_min(1e-5).float(), rtol=1e-6)


def test_balances_ranges_and_flattens():
    a = torch.tensor([64.0, 1.0, 2.0, 1.0])
    w = torch.tensor([1.0, 1.0, 1.0, 1.0])
    s = smoothing_factors(a, w, 0.5)
    assert torch.allclose(a / s, w * s)  # alpha 0.5: equal activation and weight maxima per channel
    assert channel_max_ratio(a / s) < channel_max_ratio(a)


def test_bad_input():
    with pytest.raises(ValueError, match="two vectors"):
        smoothing_factors(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match="alpha"):
        smoothing_factors(torch.ones(3), torch.ones(3), alpha=1.5)
