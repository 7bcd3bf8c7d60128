"""BOS/EOS positions: masks in every layout, separate calibration ranges, FP rows at run time, artifacts.

References are written here independently: loops over positions for the masks,
activations captured by plain hooks on the float model for the ranges, and the
site's quantizer applied by hand for the quantized rows.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn import functional as F

import ptq_protein as pp
from ptq_protein.calibration.masks import special_positions
from ptq_protein.models.adapters import get_adapter
from ptq_protein.nn.modules import ActQuantizer, QuantLinear
from ptq_protein.recipes.config import QuantConfig, SpecialTokens
from ptq_protein.recipes.presets import resolve_config

SITE = "layers.1.self_attn_layer_norm"  # tiny-esm2: its input (the residual stream) carries the BOS/EOS outliers
LINEAR = "layers.0.self_attn.q_proj"


def _masks():
    """Two sequences, T = 7: [BOS r r r r EOS pad] and [BOS r r EOS pad pad pad]."""
    computed = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    special = torch.zeros_like(computed)
    special[0, [0, 5]] = special[1, [0, 3]] = True
    return computed, special


def _is_special(b, i, computed, special):
    return bool(computed[b, i] and special[b, i])


def test_special_positions_in_every_layout():
    computed, special = _masks()
    B, T, C, H = 2, 7, 3, 4
    got = special_positions((B, T, C), computed, special)  # batch first
    assert torch.equal(got.expand(B, T, 1).squeeze(-1), special)
    got = special_positions((T, B, C), computed, special)  # fair-esm (T, B, C)
    assert torch.equal(got.expand(T, B, 1).squeeze(-1), special.t())
    got = special_positions((B * H, T, T), computed, special, channel_last=False).expand(B * H, T, T)
    for bh in range(B * H):
        for i in range(T):
            for j in range(T):
                b = bh // H
                inside = bool(computed[b, i] and computed[b, j])
                expected = inside and (_is_special(b, i, computed, special) or _is_special(b, j, computed, special))
                assert bool(got[bh, i, j]) == expected, (bh, i, j)
    assert special_positions((B, T - 2, C), computed, special) is None  # residue-indexed (ESMFold trunk)
    assert special_positions((B, T, C), computed, torch.zeros_like(special)) is None


def _captured_rows(model, seqs, name):
    """(values at BOS/EOS, values at residues) of ``name``'s input in the float model, batch of all seqs."""
    adapter = get_adapter(model)
    batch = adapter.make_batch(seqs)
    seen = []
    handle = model.get_submodule(name).register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    try:
        with torch.no_grad():
            adapter.forward(model, batch)
    finally:
        handle.remove()
    x = seen[0].transpose(0, 1)  # (T, B, C) -> (B, T, C)
    return x[batch.special_mask], x[batch.token_mask]


@pytest.mark.parametrize("mode", list(SpecialTokens))
def test_calibration_ranges_per_mode(esm2, seqs, mode):
    special, residues = _captured_rows(esm2, seqs, SITE)
    assert special.abs().max() > 5 * residues.abs().max()  # the planted outliers: the test means something
    cfg = resolve_config("a8-uniform").replace(special_tokens=mode)
    row = next(r for r in pp.quantize(esm2, cfg, calibration=seqs, batch_size=8).ptq_state.report if r["site"] == SITE)
    assert row["special_min"] == pytest.approx(float(special.min()))
    assert row["special_max"] == pytest.approx(float(special.max()))
    assert row["special_count"] == special.numel()
    counted = torch.cat([residues, special]) if mode is SpecialTokens.INCLUDE else residues
    assert row["min"] == pytest.approx(float(counted.min())) and row["max"] == pytest.approx(float(counted.max()))
    assert row["count"] == counted.numel()


def _site_io(model, tokens, name):
    """(input, output) of ``name``'s input quantizer during one forward."""
    seen = {}
    quant = model.get_submodule(name).input_quant

    def hook(module, args, out):
        seen["x"], seen["y"] = args[0].detach(), out.detach()

    handle = quant.register_forward_hook(hook)
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        handle.remove()
    return seen["x"], seen["y"]


def test_float_keeps_bos_eos_rows_exact_and_quantizes_the_rest(esm2, seqs):
    cfg = resolve_config("w8a8-uniform")
    assert cfg.special_tokens is SpecialTokens.FLOAT  # the presets' default
    qmodel = pp.quantize(esm2, cfg, calibration=seqs)
    clip = pp.quantize(esm2, cfg.replace(special_tokens="clip"), calibration=seqs)
    batch = get_adapter(esm2).make_batch(seqs[:3])
    x, y = _site_io(qmodel, batch.inputs["tokens"], SITE)
    special, rest = batch.special_mask.t(), ~batch.special_mask.t()  # (T, B)
    assert torch.equal(y[special], x[special])
    quant = qmodel.get_submodule(SITE).input_quant
    by_hand = ActQuantizer(quant.spec, scale=quant.scale, zero_point=quant.zero_point)(x)  # no context
    assert torch.equal(y[rest], by_hand[rest])  # residues and padding: quantized
    assert not torch.equal(by_hand[special], x[special])
    assert torch.equal(quant.scale, clip.get_submodule(SITE).input_quant.scale)  # same residue statistics
    assert quant.special_tokens._computed is None  # forgotten when the forward ended


def test_float_int8_backend_matches_fake_on_special_rows(esm2, seqs):
    fake = pp.quantize(esm2, "w8a8-uniform", calibration=seqs)
    real = pp.quantize(esm2, "w8a8-uniform", calibration=seqs, backend="int8")
    tokens = get_adapter(esm2).make_batch(seqs[:2]).inputs["tokens"]
    with torch.no_grad():
        out_f, out_i = fake(tokens)["logits"], real(tokens)["logits"]
    assert (out_f - out_i).norm() <= 1e-3 * out_f.norm()
    linear = real.get_submodule(LINEAR)
    assert isinstance(linear, QuantLinear)
    x = torch.randn(7, 2, linear.in_features)
    special = torch.zeros(2, 7, dtype=torch.bool)
    special[:, 0] = special[0, 6] = special[1, 4] = True
    context = linear.input_quant.special_tokens
    context._computed, context._special, context._masks = torch.ones_like(special), special, {}
    try:
        y = linear(x)
        expected = F.linear(x, linear.dequantized_weight(torch.float32), linear.bias)
        assert torch.allclose(y[special.t()], expected[special.t()], rtol=1e-6, atol=1e-5)
        fake_linear = fake.get_submodule(LINEAR)
        fake_linear.input_quant.special_tokens._computed = torch.ones_like(special)
        fake_linear.input_quant.special_tokens._special = special
        fake_linear.input_quant.special_tokens._masks = {}
        assert torch.allclose(y, fake_linear(x), rtol=1e-5, atol=1e-4)
    finally:
        context.clear()
        fake.get_submodule(LINEAR).input_quant.special_tokens.clear()


@pytest.mark.parametrize("mode", ["float", "include"])
def test_artifact_round_trip_keeps_the_mode(esm2, seqs, tmp_path, mode):
    cfg = resolve_config("w8a8-uniform").replace(special_tokens=mode)
    qmodel = pp.quantize(esm2, cfg, calibration=seqs)
    pp.save(qmodel, tmp_path / "a")
    loaded = pp.load(tmp_path / "a", backend="fake")
    assert loaded.ptq_state.config.special_tokens is SpecialTokens(mode)
    tokens = get_adapter(esm2).make_batch(seqs).inputs["tokens"]
    with torch.no_grad():
        assert torch.equal(qmodel(tokens)["logits"], loaded(tokens)["logits"])
    recipe = json.loads((tmp_path / "a" / "recipe.json").read_text())
    assert recipe["config"]["special_tokens"] == mode


def test_config_without_the_field_means_the_old_behaviour():
    data = resolve_config("w8a8-pwlq").to_dict()
    assert QuantConfig.from_dict(data).special_tokens is SpecialTokens.FLOAT
    del data["special_tokens"]
    assert QuantConfig.from_dict(data).special_tokens is SpecialTokens.CLIP
    with pytest.raises(ValueError, match="unknown SpecialTokens 'fp'; choose one of: float, include, clip"):
        QuantConfig(special_tokens="fp")


def test_esmfold_stem_keeps_bos_eos_and_trunk_is_untouched(esmfold, seqs):
    qmodel = pp.quantize(esmfold, "w8a8-uniform", calibration=seqs[:2], num_recycles=0)
    adapter = get_adapter(esmfold)
    batch = adapter.make_batch([seqs[1], seqs[3]])  # different lengths: padding in the stem
    seen = {}
    hooks = []
    for name in ("esm.encoder.layer.0.attention.self.query", "trunk.blocks.0.sequence_to_pair.layernorm"):
        quant = qmodel.get_submodule(name).input_quant

        def hook(module, args, out, name=name):
            seen[name] = (args[0].detach(), out.detach(), module.special_rows(args[0]))

        hooks.append(quant.register_forward_hook(hook))
    try:
        with torch.no_grad():
            adapter.forward(qmodel, batch, num_recycles=0)
    finally:
        for h in hooks:
            h.remove()
    x, y, rows = seen["esm.encoder.layer.0.attention.self.query"]
    assert torch.equal(rows.expand(*x.shape[:-1], 1).squeeze(-1), batch.special_mask)
    assert torch.equal(y[batch.special_mask], x[batch.special_mask])
    assert not torch.equal(y[batch.token_mask], x[batch.token_mask])
    assert seen["trunk.blocks.0.sequence_to_pair.layernorm"][2] is None
