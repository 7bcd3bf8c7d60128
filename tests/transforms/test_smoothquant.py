"""SmoothQuant folding: the float model's outputs are unchanged and the per-channel ranges flatten."""

import copy

import pytest
import torch

import ptq_protein as pp
from ptq_protein.models.adapters import get_adapter
from ptq_protein.quant.smoothing import channel_max_ratio
from ptq_protein.recipes.config import SmoothQuantSpec
from ptq_protein.transforms.smoothquant import input_channel_absmax, smooth_model_


def _outputs(model, seqs):
    adapter = get_adapter(model)
    batch = adapter.make_batch(seqs[:3])
    kwargs = {"num_recycles": 0} if adapter.family == "hf-esmfold" else {}
    with torch.no_grad():
        out = adapter.forward(model, batch, **kwargs)
    if adapter.family == "hf-esmfold":
        return {k: out[k] for k in ("positions", "s_z", "s_s")}
    return {"logits": out["logits"]}


def _max_rel_err(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("fixture", ["esm2", "hf_esm2", "esmfold", "esmc"])
def test_fp_outputs_unchanged_and_ratio_reduced(fixture, request, seqs):
    model = request.getfixturevalue(fixture)
    adapter = get_adapter(model)
    smoothed = copy.deepcopy(model)
    pairs = adapter.smoothing_pairs(model)
    assert pairs, "the adapter knows no LayerNorm -> Linear pair"
    first = [lins[0] for _, lins in pairs]
    before = input_channel_absmax(model, adapter, first, seqs)
    factors = smooth_model_(smoothed, adapter, seqs, SmoothQuantSpec(alpha=0.5))
    assert set(factors) == {ln for ln, _ in pairs}
    # float32, as the models run; ESMFold's structure module amplifies float32 rounding of the
    # trunk (positions measured at ~1e-5), so its coordinates are compared in float64 below.
    ref, got = _outputs(model, seqs), _outputs(smoothed, seqs)
    for key in ref:
        err = _max_rel_err(got[key], ref[key])
        print(fixture, key, "float32 max rel err", err)
        assert key == "positions" or err <= 1e-5, key
    # float64 execution of the same float32 parameters: the fold itself, without float32 arithmetic noise
    ref, got = _outputs(copy.deepcopy(model).double(), seqs), _outputs(copy.deepcopy(smoothed).double(), seqs)
    for key in ref:
        err = _max_rel_err(got[key], ref[key])
        print(fixture, key, "float64 max rel err", err)
        assert err <= 1e-5, key
    after = input_channel_absmax(smoothed, adapter, first, seqs)
    ratios = [(channel_max_ratio(before[n]), channel_max_ratio(after[n])) for n in first]
    print(fixture, "max/median channel ratio before -> after", ratios[:4])
    # alpha=0.5 maps channel maxima a_j to sqrt(a_j * w_j): flatter unless the weight columns vary more
    # than the activations (some random trunk layers), so the claim is on the pairs as a whole.
    assert sum(a < b for b, a in ratios) >= 0.75 * len(ratios)
    assert sum(a for _, a in ratios) < 0.8 * sum(b for b, _ in ratios)


def test_fold_is_exact_per_pair(esm2, seqs):
    smoothed = copy.deepcopy(esm2)
    factors = smooth_model_(smoothed, get_adapter(esm2), seqs, SmoothQuantSpec(alpha=0.7))
    s = factors["layers.0.final_layer_norm"]
    ln0, ln1 = esm2.layers[0].final_layer_norm, smoothed.layers[0].final_layer_norm
    assert torch.allclose(ln1.weight * s, ln0.weight, rtol=1e-6) and torch.allclose(ln1.bias * s, ln0.bias, rtol=1e-6)
    assert torch.allclose(smoothed.layers[0].fc1.weight, esm2.layers[0].fc1.weight * s, rtol=1e-6)


def test_quantize_never_mutates_the_callers_model(esm2, seqs):
    before = {k: v.clone() for k, v in esm2.state_dict().items()}
    qmodel = pp.quantize(esm2, "w8a8-smoothquant", calibration=seqs)
    assert all(torch.equal(before[k], v) for k, v in esm2.state_dict().items())
    assert not torch.equal(qmodel.layers[0].self_attn_layer_norm.weight, esm2.layers[0].self_attn_layer_norm.weight)


def test_smoothing_lowers_w8a8_error_on_outlier_model(esm2, seqs):
    tokens = get_adapter(esm2).make_batch(seqs[:3]).inputs["tokens"]
    with torch.no_grad():
        ref = esm2(tokens)["logits"]
        plain = pp.quantize(esm2, pp.get_preset("w8a8-smoothquant").replace(smoothquant=None), calibration=seqs)
        smooth = pp.quantize(esm2, "w8a8-smoothquant", calibration=seqs)
        err_plain = float((plain(tokens)["logits"] - ref).norm() / ref.norm())
        err_smooth = float((smooth(tokens)["logits"] - ref).norm() / ref.norm())
    print("w8a8 per-tensor relative error without / with smoothing", err_plain, err_smooth)
    assert err_smooth < err_plain
