"""End-to-end behaviour of pp.quantize on tiny models of the real classes."""

import math

import pytest
import torch

import ptq_protein as pp
from ptq_protein.eval.bench.fidelity import relative_error
from ptq_protein.models.adapters import get_adapter
from ptq_protein.recipes.config import QuantConfig, SiteKind, TensorQuant
from ptq_protein.recipes.presets import PRESETS
from ptq_protein.support.errors import InputError


def _logits(model, seqs):
    batch = get_adapter(model).make_batch(seqs)
    with torch.no_grad():
        return model(batch.inputs["tokens"])["logits"]


def test_all_sites_disabled_is_bit_identical(esm2, seqs):
    for config in (QuantConfig(kinds=()), PRESETS["fp"], QuantConfig(exclude=("*",), kinds=())):
        q = pp.quantize(esm2, config)
        assert torch.equal(_logits(esm2, seqs[:2]), _logits(q, seqs[:2]))


def test_caller_model_is_not_modified(esm2, seqs):
    before = {k: v.clone() for k, v in esm2.state_dict().items()}
    pp.quantize(esm2, "w8a8-pwlq", calibration=seqs)
    after = esm2.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not hasattr(esm2, "ptq_state")


def test_pwlq_beats_uniform_on_outlier_model(esm2, seqs):
    """Trained-ESM-like outlier channels: PWLQ A8 keeps logits closer to FP than uniform A8."""
    ref = _logits(esm2, seqs)
    errors = {}
    for preset in ("w8a8-uniform", "w8a8-pwlq"):
        q = pp.quantize(esm2, preset, calibration=seqs, batch_size=2)
        errors[preset] = relative_error(ref, _logits(q, seqs))
    print("logits relative error", errors)
    assert errors["w8a8-pwlq"] < 0.8 * errors["w8a8-uniform"], errors


# The ESM C-only recipes (the SwiGLU rotation) refuse ESM-2: tests/core/test_rotate_recipes.py runs them on ESM C;
# the ESMFold-only ones (trunk_dtype) run in tests/core/test_trunk_dtype.py.
@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "fp" and not PRESETS[p].rotate_ffn
                                    and not PRESETS[p].trunk_dtype])
def test_every_preset_runs_on_hf_esm2(hf_esm2, seqs, preset):
    q = pp.quantize(hf_esm2, preset, calibration=seqs, batch_size=2)
    batch = get_adapter(hf_esm2).make_batch(seqs[:2])
    with torch.no_grad():
        out = q(**batch.inputs).logits
    assert torch.isfinite(out).all()
    assert q.ptq_state.quantized, "some site must be quantized"


@pytest.mark.parametrize("preset", ["w8a8-uniform", "w8a8-pwlq", "w8-only", "w4a8-pwlq", "w6a6-pwlq", "w8a8-pwlq-all"])
def test_esmfold_presets_infer_without_nan(esmfold, seqs, preset):
    q = pp.quantize(esmfold, preset, calibration=seqs[:3], batch_size=2, num_recycles=0)
    groups = {s.group for s in q.ptq_state.sites}
    assert {"esm", "trunk", "structure"} <= groups
    out = q.infer(seqs[1])
    assert torch.isfinite(out["positions"]).all() and torch.isfinite(out["plddt"]).all()


def test_site_groups_select(esmfold, seqs):
    q = pp.quantize(esmfold, QuantConfig(groups=("trunk",)), calibration=seqs[:2], num_recycles=0)
    assert {s.group for s in q.ptq_state.sites} == {"trunk"}
    with pytest.raises(ValueError, match="unknown site groups"):
        pp.quantize(esmfold, QuantConfig(groups=("nope",)), calibration=seqs[:2])


def test_heads_stay_fp(esm2, seqs):
    q = pp.quantize(esm2, "w8a8-pwlq", calibration=seqs)
    names = {s.name for s in q.ptq_state.sites}
    assert not any(n.startswith(("lm_head", "contact_head")) for n in names)
    assert any(n.endswith("self_attn_layer_norm") for n in names)


def test_esm1b_fast_path_is_disabled_so_sites_fire(seqs):
    import argparse

    import esm

    args = argparse.Namespace(arch="roberta_large", layers=2, embed_dim=32, ffn_embed_dim=64, attention_heads=4,
                              max_positions=1024, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                              final_bias=True)
    torch.manual_seed(0)
    model = esm.model.esm1.ProteinBertModel(args, esm.data.Alphabet.from_architecture("ESM-1b")).eval()
    q = pp.quantize(model, "w8a8-uniform", calibration=seqs)
    assert not q.ptq_state.fp_sites, q.ptq_state.fp_sites
    assert any("q_proj" in n for n in q.ptq_state.quantized)


def test_report_has_statistics(esm2, seqs):
    q = pp.quantize(esm2, "w8a8-pwlq", calibration=seqs)
    rows = [r for r in q.ptq_state.report if "count" in r]
    assert rows and all(math.isfinite(r["kurtosis"]) and -1 <= r["asymmetry"] <= 1 for r in rows)
    assert all(r["sqnr_db"] > 10 for r in rows), [r["sqnr_db"] for r in rows]


# -- bad input -------------------------------------------------------------------------

def test_bad_inputs(esm2, seqs):
    with pytest.raises(ValueError, match="unknown preset"):
        pp.quantize(esm2, "w9a9")
    with pytest.raises(ValueError, match="outside 2..16"):
        TensorQuant(bits=17)
    with pytest.raises(ValueError, match="outside 2..16"):
        TensorQuant(bits=1)
    with pytest.raises(InputError, match="empty"):
        pp.quantize(esm2, "w8a8-pwlq", calibration=[])
    with pytest.raises(InputError, match="needs calibration"):
        pp.quantize(esm2, "w8a8-pwlq")
    with pytest.raises(InputError, match="J"):
        pp.quantize(esm2, "w8a8-pwlq", calibration=["MKTJAY"])
    with pytest.raises(InputError, match="1022"):
        pp.quantize(esm2, "w8a8-pwlq", calibration=["A" * 1023])
    with pytest.raises(TypeError, match="does not know"):
        pp.quantize(torch.nn.Sequential(torch.nn.ReLU()), "w8a8-pwlq", calibration=seqs)
    with pytest.raises(InputError, match="selects no site"):
        pp.quantize(esm2, QuantConfig(include=("no.such.*",)), calibration=seqs)


def test_nan_activations_are_reported_with_the_site(esm2, seqs):
    import copy

    broken = copy.deepcopy(esm2)
    with torch.no_grad():
        broken.layers[0].fc1.weight[0, 0] = float("nan")
    with pytest.raises(InputError, match=r"NaN in activations at site layers\.0\.fc2"):
        pp.quantize(broken, "w8a8-pwlq", calibration=seqs)


def test_zero_range_activation_site_is_safe():
    """A constant (all-zero) site gets a valid quantizer that is exact at zero."""
    from ptq_protein.calibration.calibrate import SiteStats
    from ptq_protein.calibration.sites import Site
    from ptq_protein.nn.qparams import activation_quantizer

    for preset in ("w8a8-uniform", "w8a8-pwlq"):
        spec = PRESETS[preset].activations
        stats = SiteStats(Site("x", SiteKind.LINEAR, "esm", "Linear", False), spec)
        stats.update(torch.zeros(10, 4))
        quant = activation_quantizer(spec, stats)
        x = torch.zeros(3, 4)
        assert torch.equal(quant(x), x)
        assert torch.isfinite(quant(torch.ones(2, 4))).all()


def test_matmul_sites_quantize_attention_operands(esm2, esmfold, seqs):
    """w8a8-pwlq-all quantizes both operands of QK^T and softmax·V (and ESMFold's triangle products)."""
    q = pp.quantize(esm2, "w8a8-pwlq-all", calibration=seqs)
    subs = [r["site"] for r in q.ptq_state.report if r["kind"] == "matmul"]
    assert subs == [f"layers.{i}.self_attn@{c}.{o}" for i in range(2) for c in range(2) for o in range(2)]
    assert all(r["count"] > 0 for r in q.ptq_state.report if r["kind"] == "matmul")
    base = pp.quantize(esm2, "w8a8-pwlq", calibration=seqs)
    assert not torch.equal(_logits(q, seqs[:1]), _logits(base, seqs[:1])), "matmul quantization must act"
    qf = pp.quantize(esmfold, "w8a8-pwlq-all", calibration=seqs[:2], num_recycles=0)
    hosts = {r["site"].split("@")[0] for r in qf.ptq_state.report if r["kind"] == "matmul"}
    assert any("tri_mul" in h for h in hosts) and any("tri_att" in h for h in hosts)
    assert torch.isfinite(qf.infer(seqs[1])["positions"]).all()


def test_calibration_statistics_ignore_padding(esm2, seqs):
    """Batching short with long sequences (padding, BOS/EOS) gives the same statistics as one at a time."""
    from ptq_protein.calibration.calibrate import calibrate
    from ptq_protein.calibration.sites import discover_sites, select_sites
    from ptq_protein.models.adapters import get_adapter

    cfg = PRESETS["w8a8-pwlq-all"]
    adapter = get_adapter(esm2)
    sites = select_sites(discover_sites(esm2, adapter), cfg)
    specs = {s.name: cfg.activations for s in sites}
    together = calibrate(esm2, adapter, sites, specs, seqs[:3], batch_size=3)
    alone = calibrate(esm2, adapter, sites, specs, seqs[:3], batch_size=1)
    assert together.keys() == alone.keys()
    for name in together:
        a, b = together[name].moments, alone[name].moments
        assert int(a.count) == int(b.count), name
        assert torch.allclose(a.min_val, b.min_val, atol=1e-5) and torch.allclose(a.max_val, b.max_val, atol=1e-5), name


def test_calibration_memory_is_bounded(esm2, seqs):
    """Observer state does not grow with the number of calibration sequences."""
    from ptq_protein.calibration.calibrate import calibrate
    from ptq_protein.calibration.sites import discover_sites, select_sites
    from ptq_protein.models.adapters import get_adapter

    cfg = PRESETS["w8a8-uniform"]
    adapter = get_adapter(esm2)
    sites = select_sites(discover_sites(esm2, adapter), cfg)
    specs = {s.name: cfg.activations for s in sites}

    def state_numel(stats):
        total = 0
        for st in stats.values():
            for obj in (st.moments, st.histogram, st.minmax, st.topk):
                total += sum(v.numel() for v in vars(obj).values() if torch.is_tensor(v))
                if hasattr(obj, "moments") and obj.moments is not None:
                    total += sum(v.numel() for v in vars(obj.moments).values() if torch.is_tensor(v))
        return total

    small = calibrate(esm2, adapter, sites, specs, seqs[:2], batch_size=1)
    large = calibrate(esm2, adapter, sites, specs, seqs * 4, batch_size=1)
    assert state_numel(small) == state_numel(large)


@pytest.mark.parametrize("preset", ["w8a8-uniform", "w8a8-pwlq"])
def test_cast_to_bfloat16_keeps_the_quantization_parameters(esm2, seqs, preset):
    """qmodel.to(bf16) runs in bf16 (fair-esm's rotary tables from calibration are dropped) with float32 scales."""
    import copy

    from ptq_protein.nn.modules import ActQuantizer, QuantLinear

    q = pp.quantize(esm2, preset, calibration=seqs, batch_size=2)
    q16 = copy.deepcopy(q).to(torch.bfloat16)
    logits = _logits(q16, seqs[:1])
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    scales = [(n, b) for n, b in q16.named_buffers() if n.endswith("scale")]
    assert scales and all(b.dtype == torch.float32 for _, b in scales)
    assert all(torch.equal(b, q.get_buffer(n)) for n, b in scales)
    lin = next(m for m in q16.modules() if isinstance(m, QuantLinear) and isinstance(m.input_quant, ActQuantizer))
    lin32 = q.get_submodule(next(n for n, m in q16.named_modules() if m is lin))
    x = torch.randn(7, lin.in_features).to(torch.bfloat16)
    assert torch.equal(lin.input_quant(x), lin32.input_quant(x))  # the same grid, whatever the module dtype


@pytest.mark.parametrize("bits", [12, 16])
def test_weights_wider_than_8_bits_keep_their_codes(esm2, seqs, bits, tmp_path):
    """Codes above 8 bits are stored as int16 (int8 wrapped them: ~100% error, silently); each weight is
    within half a step (plus float32 rounding) of w, the step s = max|row| / (2^(b-1) - 1) in float64."""
    config = QuantConfig(weights=TensorQuant(bits=bits, granularity="per_channel"), activations=None)
    q = pp.quantize(esm2, config)
    qmax = 2 ** (bits - 1) - 1
    for name, module in q.named_modules():
        if not hasattr(module, "weight_codes"):
            continue
        w = esm2.get_submodule(name).weight.detach().double()
        step = w.abs().amax(dim=1, keepdim=True) / qmax
        assert module.weight_codes.dtype == torch.int16
        assert (module.weight_codes.double() - torch.round(w / step)).abs().max() <= 1
        float32_roundings = 4 * torch.finfo(torch.float32).eps * w.abs()  # the scale and the decoded value
        assert (module.dequantized_weight(torch.float32).double() - w).abs().le(step / 2 + float32_roundings).all()
    pp.save(q, tmp_path / "a")
    loaded = pp.load(tmp_path / "a")  # a recipe integer GEMMs cannot run keeps its simulation
    assert torch.equal(_logits(loaded, seqs[:2]), _logits(q, seqs[:2]))
    assert relative_error(_logits(esm2, seqs[:2]), _logits(q, seqs[:2])) < 1e-3
