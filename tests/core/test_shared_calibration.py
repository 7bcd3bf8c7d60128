"""Several recipes from one calibration pass: same models as calibrating each alone, fewer passes."""

import dataclasses

import pytest
import torch

import ptq_protein as pp
from ptq_protein.calibration.sharing import StatsNeeds, merge_collection_specs
from ptq_protein.models.adapters import get_adapter
from ptq_protein.recipes.config import Granularity, RangeMethod, Scheme, TensorQuant
from ptq_protein.workflows import shared_calibration


def _logits(model, seqs):
    adapter = get_adapter(model)
    with torch.no_grad():
        return adapter.forward(model, adapter.make_batch(seqs))["logits"]


def test_shared_pass_gives_the_same_models_as_calibrating_alone(esm2, seqs, calibration_counter):
    recipes = ["w8a8-pwlq", "w8a8-uniform", "a8-pwlq", "w8a8-pwlq-all"]
    passes, notes = shared_calibration.calibrate_recipes(esm2, recipes, seqs, batch_size=2)
    counts = dict(calibration_counter)
    assert counts["passes"] == 1 and not notes
    batches = len(list(get_adapter(esm2).batches(seqs, 2)))
    assert counts["forwards"] == batches  # one pass over the calibration set, not one per recipe
    for recipe in recipes:
        assert passes[recipe] is passes["w8a8-pwlq"]
        shared = pp.quantize(esm2, recipe, statistics=passes[recipe])
        alone = pp.quantize(esm2, recipe, calibration=seqs, batch_size=2)
        torch.testing.assert_close(_logits(shared, seqs), _logits(alone, seqs), rtol=0, atol=0)
        assert shared.ptq_state.calibration == alone.ptq_state.calibration
        assert shared.ptq_state.report == alone.ptq_state.report


def test_incompatible_statistics_get_their_own_pass_with_a_reason(esm2, seqs, calibration_counter):
    other_k = pp.get_preset("w8a8-uniform").replace(
        name="uniform-top5", activations=TensorQuant(bits=8, range_method=RangeMethod.TOPK, topk=5))
    recipes = ["w8a8-uniform", other_k, "w8a8-pwlq", "w8-only", "w8a8-dynamic"]
    passes, notes = shared_calibration.calibrate_recipes(esm2, recipes, seqs, batch_size=2)
    counts = dict(calibration_counter)
    assert counts["passes"] == 2
    assert passes["w8a8-pwlq"] is passes["w8a8-uniform"] is not passes["uniform-top5"]
    assert passes["w8-only"] is None and passes["w8a8-dynamic"] is None  # nothing to calibrate
    assert list(notes) == ["uniform-top5"] and "different k (100 and 5)" in notes["uniform-top5"]
    with pytest.raises(ValueError, match="cannot serve recipe 'uniform-top5'"):
        pp.quantize(esm2, other_k, statistics=passes["w8a8-uniform"])


def test_stats_needs_merge():
    tensor = TensorQuant(bits=8)
    topk = TensorQuant(bits=8, range_method=RangeMethod.TOPK, topk=7)
    channel = TensorQuant(bits=8, granularity=Granularity.PER_CHANNEL)
    pwlq = TensorQuant(bits=6, scheme=Scheme.PWLQ, symmetric=False)
    merged, reason = merge_collection_specs({"a": pwlq, "b": tensor}, {"a": topk, "c": channel})
    assert reason is None and set(merged) == {"a", "b", "c"}
    assert StatsNeeds.of(merged["a"]) == StatsNeeds(per_channel=False, topk=7)
    assert StatsNeeds.of(pwlq).covered_by(StatsNeeds.of(merged["a"]))
    assert StatsNeeds.of(topk).covered_by(StatsNeeds.of(merged["a"]))
    merged, reason = merge_collection_specs({"a": tensor}, {"a": channel})
    assert merged is None and "site a" in reason and "per-channel" in reason


def test_study_recipes_share_one_batch_1_pass_and_equal_calibrating_alone(esm2, seqs, monkeypatch):
    from ptq_protein.calibration import study
    from ptq_protein.passes import forwards

    runs = []
    real = study.study_calibrate

    def counting(model, adapter, sites, sequences, k, calls, *args, **kwargs):
        runs.append(k)
        return real(model, adapter, sites, sequences, k, calls, *args, **kwargs)

    monkeypatch.setattr(forwards, "study_calibrate", counting)  # the study's pass, for calibrate_recipes and quantize
    recipes = ["study-a8-uniform", "study-a8-pwlq", "w8a8-pwlq"]  # top-1, top-2, and one of ours
    passes, notes = shared_calibration.calibrate_recipes(esm2, recipes, seqs, batch_size=2)
    assert runs == [2]  # one study pass, keeping enough extremes for both top-k
    assert passes["study-a8-uniform"] is passes["study-a8-pwlq"] is not passes["w8a8-pwlq"]
    assert "shared with study-a8-uniform" in notes["study-a8-pwlq"]
    for recipe in recipes[:2]:
        before = len(runs)
        shared = pp.quantize(esm2, recipe, statistics=passes[recipe])
        assert len(runs) == before  # the shared pass served it: no calibration run of its own
        alone = pp.quantize(esm2, recipe, calibration=seqs)
        for key, value in alone.state_dict().items():
            assert torch.equal(shared.state_dict()[key], value), (recipe, key)
        assert shared.ptq_state.report == alone.ptq_state.report
        assert shared.ptq_state.calibration == alone.ptq_state.calibration
    with pytest.raises(ValueError, match="cannot serve recipe 'study-a8-pwlq'"):
        pp.quantize(esm2, "study-a8-pwlq", statistics=passes["w8a8-pwlq"])
    narrow = pp.get_preset("study-a8-pwlq").replace(name="study-top9", activations=dataclasses.replace(
        pp.get_preset("study-a8-pwlq").activations, topk=9))
    with pytest.raises(ValueError, match="top-9"):
        pp.quantize(esm2, narrow, statistics=passes["study-a8-pwlq"])


def _counting_study_passes(monkeypatch):
    from ptq_protein.passes import forwards

    runs = []
    real = forwards.study_calibrate

    def counting(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(forwards, "study_calibrate", counting)  # where calibrate_recipes and quantize run it
    return runs


def _same_state(a, b, label):
    for key, value in b.state_dict().items():
        assert torch.equal(a.state_dict()[key], value), (label, key)
    assert a.ptq_state.report == b.ptq_state.report and a.ptq_state.calibration == b.ptq_state.calibration


def test_study_statistics_ride_a_batch_1_pass_of_ours_bit_for_bit(esm2, seqs, calibration_counter, monkeypatch):
    runs = _counting_study_passes(monkeypatch)
    recipes = ["w8a8-pwlq", "w8a8-uniform", "study-w8a8-pwlq"]
    passes, notes = shared_calibration.calibrate_recipes(esm2, recipes, seqs, batch_size=1)
    counts = dict(calibration_counter)
    assert runs == [] and counts["passes"] == 1 and counts["forwards"] == len(seqs)  # one forward a sequence
    assert passes["study-w8a8-pwlq"].study and not passes["w8a8-pwlq"].study
    assert list(notes) == ["study-w8a8-pwlq"]
    assert "observed in the forwards of the pass of w8a8-pwlq, w8a8-uniform" in notes["study-w8a8-pwlq"]
    for recipe in recipes:
        shared = pp.quantize(esm2, recipe, statistics=passes[recipe])
        alone = pp.quantize(esm2, recipe, calibration=seqs, batch_size=1)  # study-*: its own pass, as the study
        _same_state(shared, alone, recipe)
    assert runs == [1]  # only the study recipe quantized alone ran a study pass


def test_study_statistics_keep_their_own_pass_unless_the_forwards_are_the_studys(esm2, esmfold, seqs, monkeypatch):
    runs = _counting_study_passes(monkeypatch)
    _, notes = shared_calibration.calibrate_recipes(esm2, ["w8a8-pwlq", "study-w8a8-pwlq"], seqs, batch_size=2)
    assert runs == [1] and "pass of its own" in notes["study-w8a8-pwlq"]  # padded batches: not the study's tensors
    short = [s[:12] for s in seqs[:2]]
    _, notes = shared_calibration.calibrate_recipes(esmfold, ["w8a8-pwlq", "study-w8a8-pwlq"], short)
    assert runs == [1] and "observed in the forwards" in notes["study-w8a8-pwlq"]  # ESMFold's default: batch 1
    esmfold.trunk.set_chunk_size(4)  # calibration unchunks the trunk; the study's pass runs it as it is
    try:
        _, notes = shared_calibration.calibrate_recipes(esmfold, ["w8a8-pwlq", "study-w8a8-pwlq"], short)
    finally:
        esmfold.trunk.set_chunk_size(None)
    assert runs == [1, 1] and "pass of its own" in notes["study-w8a8-pwlq"]


def test_bos_eos_in_the_statistics_is_a_pass_of_its_own(esm2, seqs):
    include = pp.get_preset("w8a8-uniform").replace(name="uniform-include", special_tokens="include")
    passes, notes = shared_calibration.calibrate_recipes(esm2, ["w8a8-uniform", include], seqs, batch_size=2)
    assert passes["uniform-include"] is not passes["w8a8-uniform"] and "BOS/EOS" in notes["uniform-include"]
    shared = pp.quantize(esm2, include, statistics=passes["uniform-include"])
    alone = pp.quantize(esm2, include, calibration=seqs, batch_size=2)
    torch.testing.assert_close(_logits(shared, seqs), _logits(alone, seqs), rtol=0, atol=0)
    with pytest.raises(ValueError, match="BOS/EOS"):
        pp.quantize(esm2, include, statistics=passes["w8a8-uniform"])


def test_inplace_passes_need_no_copy_and_equal_the_copy(esm2, seqs, monkeypatch):
    import copy

    before = {k: v.clone() for k, v in esm2.state_dict().items()}
    copied, _ = shared_calibration.calibrate_recipes(esm2, ["w8a8-pwlq"], seqs, batch_size=2)

    real_deepcopy = copy.deepcopy

    def no_model_copy(obj, *args, **kwargs):
        assert not isinstance(obj, torch.nn.Module), "inplace calibration copied the model"
        return real_deepcopy(obj, *args, **kwargs)

    monkeypatch.setattr(copy, "deepcopy", no_model_copy)
    inplace, _ = shared_calibration.calibrate_recipes(esm2, ["w8a8-pwlq"], seqs, batch_size=2, inplace=True)
    monkeypatch.undo()
    assert all(v.equal(esm2.state_dict()[k]) for k, v in before.items())  # hooks only: weights untouched
    a = pp.quantize(esm2, "w8a8-pwlq", statistics=copied["w8a8-pwlq"])
    b = pp.quantize(esm2, "w8a8-pwlq", statistics=inplace["w8a8-pwlq"])
    torch.testing.assert_close(_logits(a, seqs), _logits(b, seqs), rtol=0, atol=0)
