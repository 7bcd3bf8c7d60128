"""``QuantConfig.activations_at``: some activation sites take another quantizer (per-token rows where LayerNorm
outputs enter, static ranges elsewhere), on the fake path, the fused integer layer and through an artifact."""

import json

import pytest
import torch

import ptq_protein as pp
from ptq_protein.eval.bench.fidelity import relative_error
from ptq_protein.models.adapters import get_adapter
from ptq_protein.recipes.config import Backend, Granularity, QuantConfig, TensorQuant

STATIC = TensorQuant(bits=8, symmetric=False, range_method="minmax")
TOKEN = TensorQuant(bits=8, symmetric=False, granularity=Granularity.PER_TOKEN, dynamic=True)
AT = (("*self_attn.[qkv]_proj", TOKEN), ("*.fc1", TOKEN))


def _cfg(**changes) -> QuantConfig:
    base = QuantConfig(weights=TensorQuant(bits=8, granularity=Granularity.PER_CHANNEL), activations=STATIC,
                       kinds=("linear",), activations_at=AT, name="mixed-rows")
    return base.replace(**changes)


def _tokens(model, seqs):
    return get_adapter(model).make_batch(seqs[:3]).inputs["tokens"]


def test_the_config_round_trips_and_is_absent_where_unused():
    cfg = _cfg()
    again = QuantConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.activation_for("layers.3.self_attn.k_proj") == TOKEN
    assert cfg.activation_for("layers.3.fc2") == STATIC and cfg.activation_for("layers.3.self_attn.out_proj") == STATIC
    assert "activations_at" not in _cfg(activations_at=()).to_dict()  # artifacts of other recipes are unchanged
    assert "8-bit uniform asym per_token dynamic at *self_attn.[qkv]_proj, *.fc1" in cfg.describe()


@pytest.mark.parametrize("changes, error, match", [
    (dict(activations_at=(("*.fc1",),)), TypeError, "pairs"),
    (dict(activations_at=(("*.fc1", 8),)), TypeError, "TensorQuant or a dict"),
    (dict(activations=None), ValueError, "needs activations="),
    (dict(backend="int8", activations_at=(("*.fc1", TensorQuant(bits=8, granularity="per_channel")),)),
     ValueError, "per-channel activation scales"),
    (dict(backend="int8", activations_at=(("*.fc1", TensorQuant(bits=16)),)), ValueError, "at most 8-bit"),
])
def test_bad_pairs_are_refused_when_built(changes, error, match):
    with pytest.raises(error, match=match):
        _cfg(**changes)


def test_matching_sites_take_their_quantizer_and_the_rest_the_calibrated_one(esm2, seqs):
    mixed = pp.quantize(esm2, _cfg(), calibration=seqs)
    static = pp.quantize(esm2, _cfg(activations_at=()), calibration=seqs)
    for layer, same in zip(mixed.layers, static.layers):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "fc1"):
            quant = layer.get_submodule(name).input_quant
            assert quant.spec == TOKEN
            x = torch.randn(6, quant.spec.bits * 4) * torch.linspace(0.1, 5, 6)[:, None]
            lo = x.amin(1, keepdim=True).clamp(max=0)  # each row's own range, widened to hold 0 (closed form)
            hi = x.amax(1, keepdim=True).clamp(min=0)
            scale = (hi - lo) / 255
            zero = torch.round(-128 - lo / scale)
            expected = (torch.clamp(torch.round(x / scale) + zero, -128, 127) - zero) * scale
            assert torch.allclose(quant(x), expected, atol=1e-5, rtol=0)
        for name in ("self_attn.out_proj", "fc2"):  # the same calibrated range as an all-static recipe's
            got, want = layer.get_submodule(name).input_quant, same.get_submodule(name).input_quant
            assert got.spec == STATIC and torch.equal(got.scale, want.scale)
            assert torch.equal(got.zero_point, want.zero_point)


def test_the_fused_integer_layer_runs_it_as_the_fake_path_does(esm2, seqs):
    fake = pp.quantize(esm2, _cfg(), calibration=seqs)
    real = pp.quantize(esm2, _cfg(backend=Backend.INT8), calibration=seqs)
    tokens = _tokens(esm2, seqs)
    with torch.no_grad():
        a, b, ref = fake(tokens)["logits"], real(tokens)["logits"], esm2(tokens)["logits"]
    assert relative_error(a, b) < 1e-4 < relative_error(ref, a)  # execution error far under quantization error


def test_an_artifact_keeps_each_sites_quantizer(esm2, seqs, tmp_path):
    q = pp.quantize(esm2, _cfg(), calibration=seqs)
    pp.save(q, tmp_path / "art")
    back = pp.load(tmp_path / "art", backend="fake")  # the saved model, run as it was
    assert back.layers[1].fc1.input_quant.spec == TOKEN and back.layers[1].fc2.input_quant.spec == STATIC
    tokens = _tokens(esm2, seqs)
    with torch.no_grad():
        assert torch.equal(q(tokens)["logits"], back(tokens)["logits"])
