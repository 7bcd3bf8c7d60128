"""Quantized models follow the module's dtype (.half(), .bfloat16(), .to) and autocast; codes and scales stay."""

import copy

import pytest
import torch
from torch import nn

import ptq_protein as pp
from ptq_protein.models.adapters import get_adapter
from ptq_protein.nn.modules import ActQuantizer, QuantLinear
from ptq_protein.recipes.config import TensorQuant

DTYPES = [torch.float16, torch.bfloat16]


def _quant_linear(seed: int = 0) -> QuantLinear:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-127, 128, (24, 32), generator=gen, dtype=torch.int8)
    scale = torch.rand(24, generator=gen) * 0.01 + 0.001
    spec = TensorQuant(bits=8, symmetric=False)
    act = ActQuantizer(spec, scale=torch.tensor(0.02), zero_point=torch.tensor(3, dtype=torch.int32))
    return QuantLinear(32, 24, weight=None, weight_codes=codes, weight_scale=scale,
                       weight_zero_point=torch.zeros(24, dtype=torch.int32), weight_spec=TensorQuant(bits=8),
                       bias=torch.randn(24, generator=gen), input_quant=act)


@pytest.mark.parametrize("dtype", DTYPES)
def test_act_quantizer_in_dtype_is_the_float32_quantizer_rounded(dtype):
    act = _quant_linear().input_quant
    x = (torch.randn(5, 7, 32) * 2).to(dtype)
    low = copy.deepcopy(act).to(dtype)
    assert low.scale.dtype == torch.float32 and low.zero_point.dtype == torch.int32  # the recipe is untouched
    # codes come from the same values, so the only difference is the final rounding to dtype
    assert torch.equal(low(x), act(x.float()).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_quant_linear_in_dtype_within_its_tolerance(dtype):
    lin = _quant_linear()
    x = (torch.randn(6, 32) * 2).to(dtype)
    low = copy.deepcopy(lin).to(dtype)
    assert low.weight_codes.dtype == torch.int8 and low.weight_scale.dtype == torch.float32
    assert torch.equal(low.weight_codes, lin.weight_codes) and torch.equal(low.weight_scale, lin.weight_scale)
    out = low(x)
    assert out.dtype == dtype
    ref = lin(x.float())  # the fake float32 module on the same (representable) input
    # a K=32 dot product rounded in dtype: a few ulps of the output scale
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.float(), ref, rtol=8 * eps, atol=8 * eps * ref.abs().max().item())


def test_quant_linear_honours_autocast_like_nn_linear():
    lin = _quant_linear()
    plain = nn.Linear(32, 24)
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lin(x).dtype == plain(x).dtype == torch.bfloat16
    assert lin.weight_codes.dtype == torch.int8 and lin.weight_scale.dtype == torch.float32


def _logits(model, batch):
    out = get_adapter(model).forward(model, batch)
    return out["logits"] if isinstance(out, dict) else out.logits


def _float_model_in(fp, dtype):
    """A copy of the float model in ``dtype``; fair-esm's own rotary tables must be reset by hand."""
    low = copy.deepcopy(fp)
    for module in low.modules():
        if hasattr(module, "_seq_len_cached"):
            module._seq_len_cached = None
    return low.to(dtype)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("family", ["esm2", "hf_esm2", "esmc"])
@pytest.mark.parametrize("preset", ["w8a8-pwlq", "w8a8-dynamic", "w4-only"])
def test_quantized_models_run_in_half_and_bfloat16(request, seqs, family, preset):
    """After a float32 forward (fair-esm's rotary cache trap), casts run and stay near the fake float32 model.

    Bound: the low-precision model may flip a few activation codes at rounding boundaries, so its
    distance to the fake float32 model is held to 2 x (the recipe's own quantization error + the float
    model's error in that dtype).
    """
    fp = request.getfixturevalue(family)
    q = pp.quantize(fp, preset, calibration=seqs)
    batch = get_adapter(q).make_batch(seqs[:3])
    with torch.no_grad():
        ref, fp_ref = _logits(q, batch), _logits(fp, batch)
        for dtype in DTYPES:
            out = _logits(copy.deepcopy(q).to(dtype), batch)
            fp_low = _logits(_float_model_in(fp, dtype), batch)
            assert out.dtype == dtype and torch.isfinite(out).all()
            assert _rel(out, ref) <= 2 * (_rel(ref, fp_ref) + _rel(fp_low, fp_ref)), (dtype, _rel(out, ref))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto, fp_auto = _logits(q, batch), _logits(fp, batch)
        assert auto.dtype == fp_auto.dtype  # the same dtype the float model gives under autocast
        assert _rel(auto, ref) <= 2 * (_rel(ref, fp_ref) + _rel(fp_auto, fp_ref))


@pytest.mark.parametrize("family", ["esm2", "hf_esm2", "esmc"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_model_saved_in_half_reloads_in_half(request, seqs, tmp_path, family, dtype):
    """pp.load(A).half() saved, then loaded again: the same dtype, the same logits bit for bit."""
    q = pp.quantize(request.getfixturevalue(family), "w8a8-uniform", calibration=seqs)
    pp.save(q, tmp_path / "a")
    low = pp.load(tmp_path / "a").to(dtype)
    if hasattr(low, "save_pretrained"):
        low.save_pretrained(tmp_path / "d")
    else:
        pp.save(low, tmp_path / "d")
    again = pp.load(tmp_path / "d")
    batch = get_adapter(q).make_batch(seqs[:3])
    with torch.no_grad():
        expected, got = _logits(low, batch), _logits(again, batch)
    assert got.dtype == dtype and torch.equal(got, expected)
