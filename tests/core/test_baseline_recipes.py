"""SmoothQuant / GPTQ / FP8 recipes: config round trip, artifacts, integer backend, the GPTQ pass."""

import json

import pytest
import torch
from safetensors.torch import load_file

import ptq_protein as pp
from ptq_protein.eval.bench.fidelity import relative_error
from ptq_protein.models.adapters import get_adapter
from ptq_protein.nn.modules import QuantLinear
from ptq_protein.recipes.baselines import PRESETS as BASELINES
from ptq_protein.recipes.config import FP8Format, GPTQSpec, QuantConfig, Scheme, SmoothQuantSpec, TensorQuant
from ptq_protein.support.errors import InputError

# One per kernel path (uniform int8, PWLQ x int8 codes, PWLQ x int4 codes); Triton runs interpreted on CPU.
INTEGER = ["w8a8-smoothquant", "w8a8-smoothquant-pwlq", "w4a8-gptq-pwlq"]


def _bits(t):
    """The tensor's bytes as integers (float8 has no equality op on every build)."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


def _logits(model, seqs):
    with torch.no_grad():
        return model(get_adapter(model).make_batch(seqs[:2]).inputs["tokens"])["logits"]  # at most two sequences


@pytest.mark.parametrize("name", sorted(pp.PRESETS))
def test_config_round_trip(name):
    cfg = pp.get_preset(name)
    assert QuantConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_old_recipes_without_new_fields_still_load():
    data = pp.get_preset("w8a8-pwlq").to_dict()
    for key in ("smoothquant", "gptq"):
        data.pop(key)
    data["weights"].pop("fp8_format")
    assert QuantConfig.from_dict(data) == pp.get_preset("w8a8-pwlq")


def test_bad_fields_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        SmoothQuantSpec(alpha=2.0)
    with pytest.raises(ValueError, match="group_size"):
        GPTQSpec(group_size=128)
    for field, value in (("special_rows", "no"), ("act_order", 1), ("damp", "0.01"), ("block_size", True)):
        with pytest.raises(ValueError, match=f"gptq {field}="):  # a string "no" must not read as true
            GPTQSpec.from_dict({field: value})
    with pytest.raises(ValueError, match="gptq needs symmetric per-channel"):
        QuantConfig(weights=None, gptq=GPTQSpec())
    with pytest.raises(ValueError, match="8-bit symmetric float"):
        TensorQuant(bits=4, scheme=Scheme.FP8)
    with pytest.raises(ValueError, match="unknown FP8Format"):
        TensorQuant(scheme="fp8", fp8_format="e3m4")


@pytest.fixture(scope="module")
def saved(esm2, calib_seqs, tmp_path_factory):
    """Each baseline recipe quantized once (fake backend) and saved: {name: (model, artifact folder)}."""
    out = {}
    for name in sorted(BASELINES):
        q = pp.quantize(esm2, name, calibration=list(calib_seqs))
        out[name] = (q, pp.save(q, tmp_path_factory.mktemp(name) / "a"))
    return out


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_artifact_reload_is_bit_identical(saved, seqs, name):
    q, path = saved[name]
    r = pp.load(path, backend="fake")
    assert torch.equal(_logits(q, seqs), _logits(r, seqs))
    assert r.ptq_state.config == q.ptq_state.config
    saved = dict(q.state_dict())
    for key, value in r.state_dict().items():
        assert value.dtype == saved[key].dtype and torch.equal(_bits(value), _bits(saved[key])), key
    tensors = load_file(str(path / "model.safetensors"))
    codes = {k: v.dtype for k, v in tensors.items() if k.endswith(("weight_codes", "weight_packed"))}
    expected = {torch.float8_e4m3fn} if name.endswith("fp8") else {torch.int8, torch.uint8}
    assert codes and set(codes.values()) <= expected


@pytest.mark.parametrize("name", INTEGER)
def test_int8_backend_matches_fake(saved, seqs, name, int_engine):
    fake, path = saved[name]
    real = pp.load(path, backend="int8", engine=int_engine)
    for (n, a), (_, b) in zip(fake.named_modules(), real.named_modules()):
        if isinstance(a, QuantLinear) and a.weight_spec is not None:  # same GPTQ / smoothed codes in both
            assert torch.equal(a.weight_codes, b.weight_codes) and torch.equal(a.weight_scale, b.weight_scale), n
    short = seqs[1:2]  # 16 residues: the interpreted kernels are slow
    err = relative_error(_logits(fake, short), _logits(real, short))
    print(name, "int8 vs fake relative error", err)
    assert err <= 1e-3


def test_quantize_with_int8_backend_runs_gptq_codes(esm2, saved, seqs):
    from ptq_protein.models.fused_float import use_fused_float_

    real = pp.quantize(esm2, "w4-gptq", calibration=seqs, backend="int8")
    fake = _logits(saved["w4-gptq"][0], seqs)
    assert relative_error(fake, _logits(real, seqs)) < 1e-5  # fused attention: float32 rounding
    use_fused_float_(real, enabled=False)
    assert relative_error(fake, _logits(real, seqs)) == 0  # weight-only, fake's attention: same floats


def test_fp8_refuses_int8_backend(esm2, saved, seqs):
    with pytest.raises(ValueError, match="FP8; run FP8 with backend='fake'"):
        pp.quantize(esm2, "w8a8-fp8", calibration=seqs, backend="int8")
    with pytest.raises(ValueError, match="backend 'int8' runs integer codes"):
        pp.load(saved["w8a8-fp8"][1], backend="int8")


def test_fp8_modules_equal_torch_casts(esm2, saved):
    q = saved["w8a8-fp8"][0]
    lin = q.layers[0].fc1
    assert lin.weight_codes.dtype == torch.float8_e4m3fn
    w = esm2.layers[0].fc1.weight.detach()
    scale = w.abs().amax(1, keepdim=True) / 448.0
    assert torch.equal(lin.dequantized_weight(torch.float32), (w / scale).to(torch.float8_e4m3fn).float() * scale)
    x = torch.randn(6, lin.in_features) * 4
    s = lin.input_quant.scale
    assert s.dim() == 0 and torch.equal(lin.input_quant(x),
                                        (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s)


@pytest.mark.parametrize("fmt", list(FP8Format))
def test_fp8_per_token_dynamic(esm2, seqs, fmt):
    acts = TensorQuant(bits=8, scheme="fp8", granularity="per_token", fp8_format=fmt)
    cfg = QuantConfig(weights=None, activations=acts, kinds=("linear",), name="a8-fp8-token")
    q = pp.quantize(esm2, cfg)  # dynamic: no calibration needed
    assert relative_error(_logits(esm2, seqs), _logits(q, seqs)) < 0.2


def test_gptq_beats_round_to_nearest_on_the_model(esm2_plain, seqs):
    ref = _logits(esm2_plain, seqs)
    rtn = pp.quantize(esm2_plain, "w4-only")
    gptq = pp.quantize(esm2_plain, "w4-gptq", calibration=seqs)
    err_rtn, err_gptq = relative_error(ref, _logits(rtn, seqs)), relative_error(ref, _logits(gptq, seqs))
    print("W4 logits relative error: round-to-nearest", err_rtn, "GPTQ", err_gptq)
    assert err_gptq < err_rtn
    assert gptq.ptq_state.calibration is not None
    report = {row["site"]: row for row in gptq.ptq_state.report if "weight_sqnr_db" in row}
    assert report and all(0 < row["weight_sqnr_db"] < 60 for row in report.values())  # vs the pre-GPTQ weights


def test_gptq_without_calibration_is_one_clear_error(esm2):
    with pytest.raises(InputError, match="GPTQ and needs calibration"):
        pp.quantize(esm2, "w4-gptq")


@pytest.mark.parametrize("name", ["w8a8-smoothquant", "w4-gptq", "w8a8-fp8"])
def test_esmfold_baselines_infer_without_nan(esmfold, seqs, name):
    q = pp.quantize(esmfold, name, calibration=seqs[:2], batch_size=2, num_recycles=0)
    assert {"esm", "trunk"} <= {s.group for s in q.ptq_state.sites}
    out = q.infer(seqs[1])
    assert torch.isfinite(out["positions"]).all() and torch.isfinite(out["plddt"]).all()



@pytest.mark.parametrize("fixture", ["esm2", "hf_esm2", "esmc"])
def test_the_pertoken_preset_keeps_the_first_attention_and_special_rows_in_float(fixture, request, calib_seqs):
    """``w8a8-smoothquant-gptq-pertoken``: the Linears ``w8a8-smoothquant-gptq`` swaps, less the first transformer
    layer's attention Linears (found here by each family's module names), run integer codes of per-token dynamic
    activations, with the BOS/EOS rows kept in float."""
    import re

    from ptq_protein.nn.modules import ActQuantizer

    model = request.getfixturevalue(fixture)
    calib = list(calib_seqs[:2])

    def swapped(recipe):
        q = pp.quantize(model, recipe, calibration=calib, backend="int8")
        return q, {n for n, m in q.named_modules() if isinstance(m, QuantLinear)}

    q, ours = swapped("w8a8-smoothquant-gptq-pertoken")
    _, every = swapped("w8a8-smoothquant-gptq")
    first = {n for n in every if re.search(r"(^|\.)(layers\.0\.self_attn|layer\.0\.attention|blocks\.0\.attn)\.", n)}
    assert len(first) in (2, 4) and ours == every - first  # q, k, v, out (ESM C: qkv as one Linear, out)
    quants = [m for m in q.modules() if isinstance(m, ActQuantizer)]
    assert quants and all(a.spec.granularity.value == "per_token" and a.spec.dynamic and not a.spec.symmetric
                          for a in quants)
    assert all(a.special_tokens is not None for a in quants)  # BOS/EOS rows bypass the quantizer
    assert q.ptq_state.config.gptq.special_rows  # and GPTQ's Hessian counts them: the int8 weights multiply them


@pytest.mark.parametrize("fixture", ["esm2", "hf_esm2", "esmc"])
def test_the_lntoken_preset_rounds_per_token_exactly_where_a_layernorm_output_enters(fixture, request, calib_seqs):
    """``w8a8-smoothquant-gptq-lntoken``: per-token rows at the Linears that read a LayerNorm's output (the model
    adapter's LayerNorm -> Linear pairs, which SmoothQuant folds into), static calibrated ranges at every other
    quantized Linear, the same Linears as ``w8a8-smoothquant-gptq-pertoken``."""
    from ptq_protein.models.adapters import get_adapter

    model = request.getfixturevalue(fixture)
    q = pp.quantize(model, "w8a8-smoothquant-gptq-lntoken", calibration=list(calib_seqs[:2]), backend="int8")
    pertoken = pp.quantize(model, "w8a8-smoothquant-gptq-pertoken", calibration=list(calib_seqs[:2]))
    swapped = {n: m for n, m in q.named_modules() if isinstance(m, QuantLinear)}
    assert set(swapped) == {n for n, m in pertoken.named_modules() if isinstance(m, QuantLinear)}
    after_norm = {lin for _, linears in get_adapter(model).smoothing_pairs(model) for lin in linears}
    token = {n for n, m in swapped.items() if m.input_quant.spec.granularity.value == "per_token"}
    assert token == after_norm & set(swapped) and token
    static = [m.input_quant for n, m in swapped.items() if n not in token]
    assert static and all(not a.spec.dynamic and a.scale.numel() == 1 for a in static)


def test_the_bos_preset_is_the_static_recipes_sites_with_gptq_seeing_the_bos_eos_rows(esm2, calib_seqs):
    """``w8a8-smoothquant-gptq-bos``: the Linears and static per-tensor quantizers of ``w8a8-smoothquant-gptq`` (every
    row through one quantizer, no float side path: the fast point), SmoothQuant alpha 0.4, and GPTQ whose Hessian
    sums the BOS/EOS rows: its weights differ from the same recipe's with a residue-only Hessian."""
    from ptq_protein.recipes.presets import lm_point, resolve_config

    calib = list(calib_seqs[:2])
    config = resolve_config("w8a8-smoothquant-gptq-bos")
    assert config.smoothquant.alpha == 0.4 and config.gptq.special_rows and lm_point(config) == "fast"
    q = pp.quantize(esm2, config, calibration=calib)
    residues_only = pp.quantize(esm2, config.replace(gptq=GPTQSpec()), calibration=calib)
    static = pp.quantize(esm2, "w8a8-smoothquant-gptq", calibration=calib)
    linears = {n: m for n, m in q.named_modules() if isinstance(m, QuantLinear)}
    assert set(linears) == {n for n, m in static.named_modules() if isinstance(m, QuantLinear)}
    assert all(not m.input_quant.spec.dynamic and m.input_quant.scale.numel() == 1
               and m.input_quant.special_tokens is None for m in linears.values())
    other = dict(residues_only.named_modules())
    assert any(not torch.equal(m.plain_weight_codes(), other[n].plain_weight_codes()) for n, m in linears.items())
