"""The fused integer encoder layer (``nn/layer_int8``) and its pieces (``nn/cpu_int8_fused``, ``nn/layer_float_ops``).

References: float64 products of the exact integer operands (oneDNN's epilogues), the quantizer's own rule
(``quant.uniform.quantize``), fair-esm's rotary, and the same layer run module by module (the path every other
test checks against the fake backend).
"""

import copy
import math
import warnings

import pytest
import torch
from torch.nn import functional as F

import ptq_protein as pp
from ptq_protein.models.lm_outputs import lm_forward, lm_tokens
from ptq_protein.models.tiny import tiny_esm2, tiny_hf_esm2
from ptq_protein.nn import cpu_int8, cpu_int8_fused, layer_float_ops, layer_int8
from ptq_protein.quant.uniform import quantize
from ptq_protein.recipes.config import TensorQuant
from ptq_protein.recipes.presets import resolve_config

pytestmark = pytest.mark.skipif(not cpu_int8.available(), reason=cpu_int8.reason())

SEQS = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDEL", "ACDEFGHIKLMNPQRSTVWY", "GSH"]  # a padded batch


@pytest.fixture(params=["native", "split"])
def mode(request, monkeypatch):
    """This CPU's own engine, and the split engine forced (so a VNNI CPU tests the AVX2 path too)."""
    if request.param == "split":
        monkeypatch.setattr(cpu_int8, "mode", lambda: "split")
    elif cpu_int8.mode() != "native":
        pytest.skip("this CPU's oneDNN int8 GEMM is not exact natively")
    return request.param


def _operands(m=37, k=67, n=29, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    w_scale = torch.rand(n, generator=gen) * 0.01 + 1e-3
    a = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=gen)  # every unsigned code, 0 and 255 too
    return a, w, w_scale, torch.randn(n, generator=gen), cpu_int8.prepack(w, w_scale)


def _exact(a, w, w_scale, bias, x_scale, x_zero_u8):
    """float64 ``x_scale * w_scale[n] * ((a - zero) @ W^T) + bias[n]`` from the integer operands."""
    acc = (a.double() - x_zero_u8) @ w.double().t()
    return x_scale * acc * w_scale.double() + bias.double()


def test_linear_and_linear_add_equal_the_exact_product(mode):
    a, w, w_scale, bias, packed = _operands()
    ref = _exact(a, w, w_scale, bias, 0.037, 131)
    got = cpu_int8_fused.linear(a, packed, 0.037, 131, bias)
    torch.testing.assert_close(got.double(), ref, rtol=2e-6, atol=1e-6)
    out = torch.randn(ref.shape)
    start = out.clone()
    assert cpu_int8_fused.linear_add_(out, a, packed, 0.037, 131, bias) is out or mode == "split"
    torch.testing.assert_close(out.double(), start.double() + ref, rtol=2e-6, atol=1e-5)


def test_linear_gelu_codes_are_the_quantizer_codes_of_gelu(mode):
    a, w, w_scale, bias, packed = _operands(m=64, k=96, n=80)
    y = F.gelu(_exact(a, w, w_scale, bias, 0.05, 128))
    quant = (torch.tensor(0.004), torch.tensor(-20, dtype=torch.int32), -128, 127)
    assert cpu_int8_fused.gelu_codes_fit(quant)
    got = cpu_int8_fused.linear_gelu_codes(a, packed, 0.05, 128, bias, quant).to(torch.int32) - 128
    want = quantize(y, quant[0].double(), quant[1], 8, symmetric=False).to(torch.int32)
    diff = (got - want).abs()
    step = (y / 0.004).frac().abs()
    near_tie = ((step - 0.5).abs() < 1e-3)  # float32 epilogue vs float64: a tie may round either way
    assert int(diff.max()) <= 1 and bool(((diff == 0) | near_tie).all())
    assert int((want == 127).sum()) > 0 and int((want == -20).sum()) > 0  # both ends of the range taken


def test_gelu_codes_fit_only_ranges_gelu_cannot_leave():
    s = torch.tensor(0.01)
    assert cpu_int8_fused.gelu_codes_fit((s, torch.tensor(0), -127, 127))  # -0.17 / 0.01 = -17 > -127
    assert not cpu_int8_fused.gelu_codes_fit((torch.tensor(0.001), torch.tensor(0), -127, 127))  # -170 < -127
    assert not cpu_int8_fused.gelu_codes_fit((s, torch.tensor(0), -63, 63))  # 7-bit: oneDNN saturates at 255


def test_float_rows_equal_the_float64_product_to_float32_rounding(mode):
    _, w, w_scale, bias, packed = _operands(k=300, n=50)
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(5, 300, generator=gen)
    rows[0, 7] = 900.0  # an outlier channel, as BOS rows carry
    rows[1] = 0.0
    got = cpu_int8_fused.float_rows(rows, packed, bias).double()
    ref = rows.double() @ (w.double() * w_scale.double()[:, None]).t() + bias.double()
    # float32's worst case for a K-term dot product: K * 2^-24 * sum |x_k w_k|
    bound = 300 * 2.0 ** -24 * (rows.double().abs() @ (w.double().abs() * w_scale.double()[:, None]).t())
    assert bool(((got - ref).abs() <= bound + 1e-12).all())
    torch.testing.assert_close(got[1], bias.double(), rtol=0, atol=1e-7)


def test_codes_of_the_layer_norm_follow_the_quantizer_rule():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 24, generator=gen) * 3
    w, b = torch.rand(24, generator=gen) + 0.5, torch.randn(24, generator=gen)
    quant = (torch.tensor(0.03), torch.tensor(4, dtype=torch.int32), -127, 127)
    fake = (torch.tensor(0.05), torch.tensor(-3, dtype=torch.int32), -128, 127)
    ref_x = (quantize(x, fake[0], fake[1], 8, symmetric=False).float() - fake[1]) * fake[0]
    want = quantize(F.layer_norm(ref_x, (24,), w, b, 1e-5), quant[0], quant[1], 8, symmetric=True).to(torch.int16)
    got = layer_float_ops.codes(layer_float_ops.layer_norm(x, fake, w, b, 1e-5), quant).to(torch.int16) - 128
    assert torch.equal(got, want)
    y = torch.randn(9, 5, generator=gen) * 10
    assert torch.equal(layer_float_ops.codes(y.clone(), quant).to(torch.int16) - 128,
                       quantize(y, quant[0], quant[1], 8, symmetric=True).to(torch.int16))


def test_codes_clamp_at_both_ends_and_take_each_rows_zero_point():
    """Static asymmetric codes and per-token rows (a scale and zero point per row) past both ends of the range:
    the quantizer's rule, code for code."""
    gen = torch.Generator().manual_seed(3)
    y = torch.randn(64, 48, generator=gen) * 40
    static = (torch.tensor(0.07), torch.tensor(-100, dtype=torch.int32), -128, 127)
    want = quantize(y, static[0], static[1], 8, symmetric=False).to(torch.int16)
    assert want.min() == -128 and want.max() == 127
    assert torch.equal(layer_float_ops.codes(y.clone(), static).to(torch.int16) - 128, want)
    scale = torch.rand(64, 1, generator=gen) * 0.2 + 0.05
    zero = torch.randint(-128, 128, (64, 1), generator=gen, dtype=torch.int32)
    want = torch.stack([quantize(r, s, z, 8, symmetric=False) for r, s, z in zip(y, scale, zero)]).to(torch.int16)
    assert torch.equal(layer_float_ops.codes(y.clone(), (scale, zero, -128, 127)).to(torch.int16) - 128, want)


def test_rotary_is_fair_esms_up_to_the_pair_order():
    from esm.rotary_embedding import RotaryEmbedding

    heads, dim, length, batch = 3, 8, 11, 2
    rot = RotaryEmbedding(dim)
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(batch * heads, length, dim, generator=gen), torch.randn(batch * heads, length, dim,
                                                                                 generator=gen)
    want_q, want_k = rot(q * 0.3, k)
    cos, sin = rot._update_cos_sin_tables(k, seq_dimension=-2)
    cos, sin = (t.reshape(1, length, 1, dim) for t in (cos, sin))
    as_bthd = lambda t: t.reshape(batch, heads, length, dim).transpose(1, 2)  # noqa: E731
    got_q = layer_float_ops.rotary(as_bthd(q), layer_float_ops.rotary_table(cos, sin, 0.3), torch.float32)
    got_k = layer_float_ops.rotary(as_bthd(k), layer_float_ops.rotary_table(cos, sin), torch.float32)
    order = torch.arange(dim).reshape(2, dim // 2).t().reshape(-1)  # interleaved: x1_0, x2_0, x1_1, ...
    torch.testing.assert_close(got_q, as_bthd(want_q)[..., order], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_k, as_bthd(want_k)[..., order], rtol=1e-6, atol=1e-6)
    scores = got_q.transpose(1, 2) @ got_k.transpose(1, 2).transpose(-1, -2)  # the order drops out of q . k
    torch.testing.assert_close(scores, as_bthd(want_q).transpose(1, 2) @ as_bthd(want_k).transpose(1, 2)
                               .transpose(-1, -2), rtol=1e-5, atol=1e-5)


def _quantized(kind, preset="w8a8-uniform"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tiny_esm2(seed=0)[0] if kind == "fair-esm" else tiny_hf_esm2(seed=0)[0]
        return pp.quantize(model, preset, calibration=SEQS, backend="int8")


def _per_token_asymmetric():
    """The accurate preset's activations (asymmetric per-token rows, BOS/EOS in float) on every layer, no GPTQ."""
    return resolve_config("w8a8-smoothquant-gptq-pertoken").replace(exclude=(), gptq=None)


def _first_attention_float():
    """The default ESM-2 recipe's sites (per-token rows at LayerNorm outputs, static ranges elsewhere, the first
    layer's attention in float), no GPTQ."""
    return resolve_config("w8a8-smoothquant-gptq-lntoken").replace(gptq=None)


_RECIPES = {"per-token asymmetric": _per_token_asymmetric, "first attention float": _first_attention_float}


@pytest.fixture(scope="module", params=[("fair-esm", "w8a8-uniform"), ("hf", "w8a8-uniform"),
                                        ("fair-esm", "w8a8-dynamic"), ("hf", "per-token asymmetric"),
                                        ("fair-esm", "first attention float"), ("hf", "first attention float")],
                ids=lambda p: "-".join(p))
def qmodel(request):
    kind, preset = request.param
    return _quantized(kind, _RECIPES[preset]() if preset in _RECIPES else preset)


def _run(model, calls=None):
    real = layer_int8.forward

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    layer_int8.forward = counting if calls is not None else real
    try:
        return lm_forward(model, lm_tokens(SEQS), [1, 2])
    finally:
        layer_int8.forward = real


def test_fused_layers_match_the_module_path(qmodel, mode, monkeypatch):
    """Each layer's output within float rounding (and a rare neighbouring code) of the layer run module by module;
    BOS/EOS rows, which take the float side path, as close."""
    calls = []
    fused = _run(qmodel, calls)
    assert len(calls) == 2 and pp.engine_used(qmodel) == "onednn"
    monkeypatch.setattr(layer_int8, "blocker", lambda *args: "off")
    modules = _run(qmodel)
    for layer in (1, 2):
        a, b = fused.representations[layer], modules.representations[layer]
        assert float((a - b).norm() / b.norm()) < 2e-3
        # rows (tokens) beyond float rounding: a code flipped at a rounding tie moves a few, an error moves all
        apart = ((a - b).abs() > 1e-5 * b.abs().amax()).any(-1)
        assert float(apart.float().mean()) <= 0.1
        bos = (a[:, 0] - b[:, 0]).abs().max() / b[:, 0].abs().max()
        assert float(bos) < 1e-4


@pytest.mark.parametrize("config", ["w8a8-dynamic", "per-token asymmetric"])
def test_per_token_sites_equal_the_module_path_bit_for_bit(config, mode):
    """From the same residual stream: the LayerNorm's per-token codes, the GEMM and its epilogue (fc1), and the
    residual add (fc2), exactly as the modules compute them."""
    from ptq_protein.models.fused_float import _encoder_layer

    model = _quantized("fair-esm", _per_token_asymmetric() if config == "per-token asymmetric" else config)
    layer = model.layers[0]
    roles = _encoder_layer(layer)
    x = torch.randn(23, layer.fc1.in_features, generator=torch.Generator().manual_seed(1)) * 3
    with torch.no_grad():
        inner = layer.fc1(layer.final_layer_norm(x))
        fused = layer_int8._linear(layer_int8._normed(x, roles.ffn_norm, layer_int8._act(roles.fc1.input_quant)),
                                   _packed(roles.fc1), roles.fc1.bias)
        assert torch.equal(fused, inner)
        res = x.clone()
        hidden = F.gelu(inner)
        layer_int8._linear_add_(res, layer_int8._encode(hidden.clone(), layer_int8._act(roles.fc2.input_quant)),
                                _packed(roles.fc2), roles.fc2.bias)
        assert torch.equal(res, x + layer.fc2(hidden))
    assert isinstance(layer_int8._act(roles.fc1.input_quant), layer_int8.TokenQuant)
    assert layer.fc1.engine_ran == layer.fc2.engine_ran == "onednn"  # the modules ran the integer path too


def _packed(module):
    from ptq_protein.nn.int_fast import prepack_module

    return prepack_module(module)  # the module's own prepacked weight: the one its forward reads


def test_a_model_cast_to_bfloat16_runs_attention_in_bfloat16(qmodel):
    ref = _run(qmodel).representations[2]
    calls = []
    half = copy.deepcopy(qmodel).to(torch.bfloat16)
    got = _run(half, calls).representations[2]
    assert len(calls) == 2
    assert float((got - ref).norm() / ref.norm()) < 3e-2


@pytest.mark.parametrize("why", ["pwlq", "dynamic", "hook", "contacts"])
def test_layers_the_executor_cannot_run_take_the_modules(why):
    per_tensor_dynamic = resolve_config("w8a8-uniform").replace(activations=TensorQuant(bits=8, dynamic=True))
    model = _quantized("fair-esm", {"pwlq": "w8a8-pwlq", "dynamic": per_tensor_dynamic}.get(why, "w8a8-uniform"))
    if why == "hook":
        model.layers[0].fc1.register_forward_hook(lambda *args: None)
    calls = []
    real = layer_int8.forward
    layer_int8.forward = lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs)
    try:
        lm_forward(model, lm_tokens(SEQS), [2], contacts=why == "contacts")
    finally:
        layer_int8.forward = real
    assert len(calls) == (1 if why == "hook" else 0)


def test_fake_backend_never_takes_the_executor():
    from ptq_protein.recipes.config import Backend

    model = _quantized("fair-esm")
    for m in model.modules():
        if hasattr(m, "engine_ran"):
            m.backend = Backend.FAKE
    calls = []
    _run(model, calls)
    assert calls == []


def test_lm_forward_without_logits_keeps_the_representations():
    for model in (tiny_esm2(seed=0)[0].eval(), tiny_hf_esm2(seed=0)[0].eval()):
        a, b = lm_forward(model, lm_tokens(SEQS), [1], logits=False), lm_forward(model, lm_tokens(SEQS), [1])
        assert a.logits is None and b.logits is not None
        assert torch.equal(a.representations[1], b.representations[1])


def test_gelu_minimum_is_the_constant():
    x = torch.linspace(-1.0, -0.5, 200001, dtype=torch.float64)
    assert math.isclose(float(F.gelu(x).min()), -0.16997, abs_tol=1e-5)
    assert cpu_int8_fused.GELU_MIN <= float(F.gelu(x).min())
