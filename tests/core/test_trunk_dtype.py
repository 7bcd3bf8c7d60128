"""ESMFold's trunk in bfloat16 (``trunk_dtype``), its 8-bit default recipe and the stem-only calibration forwards.

References are built apart from the code under test: the float32 fallback against the FP model whose trunk Linear
weights were rounded to bfloat16 by hand; the stem-only statistics against the same statistics taken from whole
folds; the artifact against the in-memory model it was saved from.
"""

import copy
import json

import pytest
import torch
from torch import nn

import ptq_protein as pp
from ptq_protein.calibration.calibrate import calibrate
from ptq_protein.calibration.sites import discover_sites, select_sites
from ptq_protein.eval.tmscore import tm_score
from ptq_protein.models.adapters import HFEsmFoldAdapter, get_adapter
from ptq_protein.models.float_dtypes import float_dtypes
from ptq_protein.nn import trunk_dtype
from ptq_protein.recipes.presets import preset_for_bits

SEQ = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"


def _trunk_linears(model, parts=trunk_dtype.PAIR_PARTS):
    """(name under trunk.blocks, Linear) of the blocks' ``parts``."""
    return [(n, m) for n, m in model.trunk.blocks.named_modules()
            if isinstance(m, nn.Linear) and n.split(".")[1] in parts]


def _ca(model, seq=SEQ):
    adapter = HFEsmFoldAdapter(model)
    with torch.no_grad():
        return adapter.forward(model, adapter.make_batch([seq]))["positions"][-1, 0, :, 1]


def test_pair_linears_are_held_in_bf16_and_nothing_else_changes(esmfold):
    model = trunk_dtype.use_trunk_dtype(copy.deepcopy(esmfold))
    assert _trunk_linears(model) and all(m.weight.dtype == torch.bfloat16 for _, m in _trunk_linears(model))
    held = {id(p) for _, m in _trunk_linears(model) for p in m.parameters()}
    others = [p for p in model.parameters() if id(p) not in held]
    assert others and all(p.dtype == torch.float32 for p in others)  # LayerNorms, sequence side, stem, structure
    assert _trunk_linears(model, ("seq_attention", "mlp_seq"))  # the sequence side has Linears, kept float32
    assert float_dtypes(model) == {"": "float32"}  # the record neither counts the held Linears nor casts them
    assert trunk_dtype.trunk_dtype_of(model) == "bfloat16" and trunk_dtype.trunk_dtype_of(esmfold) is None


def test_without_native_bf16_the_trunk_runs_float32_on_the_rounded_weights(esmfold, monkeypatch):
    monkeypatch.setattr(trunk_dtype, "native_bf16", lambda device: False)
    model = trunk_dtype.use_trunk_dtype(copy.deepcopy(esmfold))
    reference = copy.deepcopy(esmfold)  # the weights rounded by hand, float32 everywhere
    with torch.no_grad():
        for _, m in _trunk_linears(reference):
            for p in m.parameters():
                p.copy_(p.bfloat16().float())
    assert torch.equal(_ca(model), _ca(reference))


@pytest.mark.skipif(not trunk_dtype.native_bf16(torch.device("cpu")), reason="this CPU has no native bfloat16")
def test_with_native_bf16_the_blocks_run_under_autocast_and_stay_on_the_fold(esmfold, monkeypatch):
    model = trunk_dtype.use_trunk_dtype(copy.deepcopy(esmfold))
    seen, block = {}, model.trunk.blocks[0]
    for name, part in (("tri", block.tri_mul_out.linear_z), ("mlp", block.mlp_pair.mlp[1]),
                       ("seq", block.seq_attention.o_proj)):
        part.register_forward_hook(lambda m, a, out, name=name: seen.setdefault(name, out.dtype) and None)
    ca, ca_fp = _ca(model), _ca(esmfold)
    assert seen == {"tri": torch.bfloat16, "mlp": torch.bfloat16, "seq": torch.float32}  # pair products in bf16
    assert ca.dtype == torch.float32 and not torch.equal(ca, ca_fp)
    assert tm_score(ca.double().numpy(), ca_fp.double().numpy()).tm_score > 0.98


def test_trunk_dtype_refuses_what_is_not_esmfold(esm2):
    with pytest.raises(ValueError, match="ESMFold"):
        trunk_dtype.use_trunk_dtype(esm2)
    with pytest.raises(ValueError, match="has no trunk"):
        pp.quantize(esm2, pp.get_preset("w8a8-pwlq").replace(trunk_dtype="bfloat16"), calibration=[SEQ])
    with pytest.raises(ValueError, match="do not combine"):
        pp.QuantConfig(pair_bits=8, trunk_dtype="bfloat16")


def test_stem_sites_calibrate_from_the_stem_alone_with_the_statistics_of_whole_folds(esmfold, monkeypatch):
    adapter = get_adapter(esmfold)
    cfg = pp.get_preset("w8a8-pwlq-stem")
    sites = select_sites(discover_sites(esmfold, adapter), cfg)
    assert sites and all(s.name.startswith("esm.") for s in sites)
    trunk_calls = []
    handle = esmfold.trunk.register_forward_hook(lambda *a: trunk_calls.append(1))
    try:
        stem = calibrate(esmfold, adapter, sites, {s.name: cfg.activations for s in sites}, [SEQ, SEQ[:20]])
        assert not trunk_calls  # the trunk never ran
        monkeypatch.setattr(HFEsmFoldAdapter, "forward_for_sites",
                            lambda self, model, batch, sites, **kw: self.forward(model, batch, **kw))
        whole = calibrate(esmfold, adapter, sites, {s.name: cfg.activations for s in sites}, [SEQ, SEQ[:20]])
        assert trunk_calls
    finally:
        handle.remove()
    assert set(stem) == set(whole)
    for name, got in stem.items():
        want = whole[name]
        assert (got.calls, got.count, got.special_count) == (want.calls, want.count, want.special_count)
        assert torch.equal(got.minmax.min_val, want.minmax.min_val) and torch.equal(got.minmax.max_val,
                                                                                     want.minmax.max_val)
        assert got.moments.moments == want.moments.moments


def test_eight_bits_on_esmfold_is_the_bf16_trunk_and_others_keep_theirs():
    from ptq_protein.workflows.fidelity_bound import recipe_bound

    assert preset_for_bits(8, "hf-esmfold") == "bf16-trunk"
    assert recipe_bound(pp.get_preset("bf16-trunk")).min_tm_vs_fp == 0.9  # judged as 8 significant bits
    assert preset_for_bits(8, "hf-esm") == preset_for_bits(8, "fair-esm") == "w8a8-smoothquant-gptq-lntoken"
    assert preset_for_bits(8, "esmc") == preset_for_bits(8) == "w8a8-pwlq"
    assert preset_for_bits(4, "hf-esmfold") == "w4a8-pwlq"


def test_the_stem_recipe_saves_bf16_trunk_weights_and_loads_bit_identical(esmfold, tmp_path):
    from safetensors import safe_open

    qmodel = pp.quantize(esmfold, "w8a8-pwlq-stem", calibration=[SEQ, SEQ[:20]])
    assert all(n.startswith("esm.") for n in qmodel.ptq_state.quantized)
    out = pp.save(qmodel, tmp_path / "art")
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["config"]["trunk_dtype"] == "bfloat16" and recipe["dtypes"] == {"": "float32"}
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        name = next(n for n, _ in _trunk_linears(esmfold))
        assert f.get_tensor(f"trunk.blocks.{name}.weight").dtype == torch.bfloat16
        assert f.get_tensor("trunk.structure_module.ipa.linear_q.weight").dtype == torch.float32
    loaded = pp.load(out)
    assert all(m.weight.dtype == torch.bfloat16 for _, m in _trunk_linears(loaded))
    assert torch.equal(_ca(loaded), _ca(qmodel))
