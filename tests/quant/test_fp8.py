"""FP8 simulation equals torch's float8 casts with the chosen scale."""

import pytest
import torch

from ptq_protein.quant.fp8 import FP8_DTYPES, fp8_fake_quantize, fp8_max, fp8_per_token, fp8_quantize, fp8_scale
from ptq_protein.recipes.config import FP8Format


@pytest.mark.parametrize("fmt", list(FP8Format))
def test_fake_quant_equals_torch_cast(fmt):
    dtype = FP8_DTYPES[fmt.value]
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 5
    x[:4] = torch.tensor([0.0, -0.0, 1e-9, 3e4])
    amax = x.abs().max()
    scale = fp8_scale(amax, fmt)
    assert float(scale) == pytest.approx(float(amax) / float(torch.finfo(dtype).max), rel=1e-7)
    expected = (x / scale).to(dtype).to(torch.float32) * scale
    assert torch.equal(fp8_fake_quantize(x, scale, fmt), expected)
    assert fp8_quantize(x, scale, fmt).dtype == dtype


@pytest.mark.parametrize("fmt", list(FP8Format))
def test_saturation_nan_and_max(fmt):
    scale = torch.tensor(1.0)
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e6])
    out = fp8_fake_quantize(x, scale, fmt)
    limit = fp8_max(fmt)
    assert out[0] == limit and out[1] == -limit and torch.isnan(out[2]) and out[3] == limit
    assert fp8_max("e4m3") == 448.0 and fp8_max("e5m2") == 57344.0


def test_per_token_scales_rows():
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(1)) * torch.arange(1, 6).unsqueeze(1)
    codes, scale = fp8_per_token(x, "e4m3")
    assert scale.shape == (5, 1)
    expected = (x / scale).to(torch.float8_e4m3fn)
    assert torch.equal(codes.float(), expected.float())
    assert torch.allclose(codes.float().abs().amax(1), torch.full((5,), 448.0))


def test_bad_format_and_nonfinite_scale():
    with pytest.raises(ValueError, match="unknown FP8 format"):
        fp8_scale(torch.tensor(1.0), "e3m4")
    with pytest.raises(ValueError, match="non-finite"):
        fp8_scale(torch.tensor(float("nan")), "e4m3")
