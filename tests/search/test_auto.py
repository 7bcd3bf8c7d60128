"""Mixed precision: budgets, the plan's width, held-out verification, artifacts, bad input."""

import random

import pytest
import torch

import ptq_protein as pp
from ptq_protein.models.adapters import get_adapter
from ptq_protein.nn.modules import QuantInput, QuantLinear
from ptq_protein.recipes.site_plan import ALL_CHOICES, FP_BITS, MixedPlan, UnitChoice, average_bits, parse_choices
from ptq_protein.search.auto import UnitCosts
from ptq_protein.search.budget import Budget
from ptq_protein.search.units import UnitKind, make_units
from ptq_protein.search.workbench import Workbench
from ptq_protein.support.errors import InputError


@pytest.mark.parametrize("text,name,threshold", [("tm>=0.99", "tm", 0.99), (" logits_rel <= 0.02", "logits_rel", 0.02),
                                                 ("contacts>=0.9", "contacts", 0.9), ("TOP1>=1", "top1", 1.0)])
def test_budget_parses(text, name, threshold):
    budget = Budget.parse(text)
    assert (budget.value_name, budget.threshold) == (name, threshold)


@pytest.mark.parametrize("text,match", [("tm>0.99", "not understood"), ("tm>=abc", "not understood"),
                                        ("tm<=0.5", "higher when better"), ("rmsd<=1", "unknown"),
                                        ("tm>=1.2", "can never hold"), ("logits_rel>=0.1", "lower when better")])
def test_bad_budgets_are_one_line_input_errors(text, match):
    with pytest.raises(InputError, match=match):
        Budget.parse(text)


def test_every_choice_round_trips_its_name():
    assert len(ALL_CHOICES) == 20 and len(set(c.name for c in ALL_CHOICES)) == 20
    for choice in ALL_CHOICES:
        assert UnitChoice.parse(choice.name) == choice
        assert choice.integer == (choice.weight_bits is not None and choice.act_bits is not None)
    with pytest.raises(ValueError, match="not offered"):
        UnitChoice.parse("w5a8-pwlq")
    assert parse_choices("w4a8-uniform")[0].is_fp


def test_plan_validates_and_round_trips():
    plan = MixedPlan((("a", "w8a8-pwlq", ("a.x", "a.y")), ("b", "fp", ("b.x",))), "tm>=0.9", 9.5, (("tm", 0.95),))
    assert MixedPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(ValueError, match="two units"):
        MixedPlan((("a", "fp", ("s",)), ("b", "fp", ("s",))))
    with pytest.raises(ValueError, match="version"):
        MixedPlan.from_dict({**plan.to_dict(), "version": 99})


def test_unit_costs_equal_the_site_formula(esm2, calib_seqs):
    bench = Workbench(esm2, pp.get_preset("w8a8-pwlq"), calib_seqs[:1])
    units = make_units(bench.sites, UnitKind.LAYER)
    costs = UnitCosts(units, bench.weight_numel())
    rng = random.Random(0)
    for _ in range(20):
        plan = {u.name: rng.choice(ALL_CHOICES) for u in units}
        per_site = {s: plan[u.name] for u in units for s in u.site_names}
        expected = average_bits(per_site, bench.weight_numel(), [s.name for s in bench.sites])
        assert costs.total(plan) == pytest.approx(expected, rel=1e-12)
    assert costs.total({u.name: UnitChoice() for u in units}) == pytest.approx(FP_BITS)
    assert costs.total({u.name: UnitChoice.parse("w4a8-pwlq") for u in units}) == pytest.approx(6.0)


def _module_bits(qmodel, sites, weight_numel):
    """The plan's width recomputed from the swapped modules themselves (independent of the search)."""
    w = a = 0.0
    for site in sites:
        module = qmodel.get_submodule(site)
        quant = getattr(module, "input_quant", None) if isinstance(module, (QuantLinear, QuantInput)) else None
        a += quant.spec.bits if quant is not None else FP_BITS
        if site in weight_numel:
            spec = module.weight_spec if isinstance(module, QuantLinear) else None
            w += weight_numel[site] * (spec.bits if spec is not None else FP_BITS)
    return 0.5 * (w / sum(weight_numel.values()) + a / len(sites))


@pytest.fixture(scope="module")
def auto_model(esm2, metric_seqs, calib_seqs):
    return pp.quantize(esm2, "auto", calibration=calib_seqs, budget="logits_rel<=0.02", unit="site",
                       search_set=metric_seqs[:2], holdout=metric_seqs[2:], max_length=96)


def test_auto_meets_the_budget_on_held_out_sequences(esm2, auto_model, metric_seqs):
    plan = auto_model.ptq_state.plan
    adapter = get_adapter(esm2)
    errors = []
    with torch.no_grad():
        for seq in metric_seqs[2:]:
            batch = adapter.make_batch([seq])
            mask = batch.token_mask[0]
            ref = adapter.forward(esm2, batch)["logits"][0][mask].double()
            out = adapter.forward(auto_model, batch)["logits"][0][mask].double()
            errors.append(float((out - ref).norm() / ref.norm()))
    assert sum(errors) / len(errors) <= 0.02
    assert dict(plan.verified)["logits_rel"] == pytest.approx(sum(errors) / len(errors), rel=1e-9)
    sites = [s for _, _, names in plan.units for s in names]
    numel = {s: esm2.get_submodule(s).weight.numel() for s in sites
             if isinstance(esm2.get_submodule(s), torch.nn.Linear)}
    assert plan.avg_bits == pytest.approx(_module_bits(auto_model, sites, numel))
    assert plan.avg_bits < FP_BITS and any(c != "fp" for _, c, _ in plan.units)


def test_auto_artifact_reloads_bit_identical_and_runs_int8(auto_model, tmp_path, calib_seqs):
    path = pp.save(auto_model, tmp_path / "auto")
    loaded = pp.load(path, backend="fake")  # the saved model, run as it was
    assert loaded.ptq_state.plan == auto_model.ptq_state.plan
    adapter = get_adapter(auto_model)
    batch = adapter.make_batch(calib_seqs[:2])
    with torch.no_grad():
        ref = adapter.forward(auto_model, batch)["logits"]
        torch.testing.assert_close(adapter.forward(loaded, batch)["logits"], ref, rtol=0, atol=0)
        short = adapter.make_batch([calib_seqs[0][:24]])  # the CPU integer reference is slow: one short sequence
        ref = adapter.forward(auto_model, short)["logits"]
        out = adapter.forward(pp.load(path, backend="int8"), short)["logits"]
    assert (out - ref).norm() / ref.norm() < 1e-2
    assert "choice" in (path / "report.md").read_text()


def test_max_bits_avg_is_respected(esm2, metric_seqs, calib_seqs):
    qmodel = pp.quantize(esm2, "auto", calibration=calib_seqs, max_bits_avg=6, unit="layer",
                         search_set=metric_seqs[:1], holdout=metric_seqs[1:2])
    assert qmodel.ptq_state.plan.avg_bits <= 6 + 1e-9


def test_a_budget_no_plan_meets_names_the_best_reached(esm2, metric_seqs, calib_seqs):
    with pytest.raises(InputError, match=r"best reached is logits_rel=\d"):
        pp.quantize(esm2, "auto", calibration=calib_seqs, budget="logits_rel<=0.000001", unit="part",
                    search_set=metric_seqs[:1], holdout=metric_seqs[1:2])
    with pytest.raises(InputError, match="averages"):
        pp.quantize(esm2, "auto", calibration=calib_seqs, max_bits_avg=3, unit="part", choices=ALL_CHOICES[:3],
                    search_set=metric_seqs[:1], holdout=metric_seqs[1:2])


def test_budget_only_with_auto(esm2):
    with pytest.raises(InputError, match="config='auto'"):
        pp.quantize(esm2, "w8a8-pwlq", calibration=["MKTAYIAK"], budget="tm>=0.9")
