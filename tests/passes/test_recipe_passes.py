"""Recipes as passes: which passes a preset lists, the one calibration plan, and a new pass added by a file."""

import pytest

import ptq_protein as pp
from ptq_protein.calibration.sites import discover_sites
from ptq_protein.models.adapters import get_adapter
from ptq_protein.passes import recipe as recipe_mod
from ptq_protein.passes.base import Needs
from ptq_protein.passes.plan import plan_calibration
from ptq_protein.passes.recipe import resolve_recipe
from ptq_protein.recipes.config import SiteKind
from ptq_protein.workflows.shared_calibration import calibrate_recipes

pytest.importorskip("esm")


@pytest.mark.parametrize("preset, expected", [
    ("w8a8-smoothquant-pwlq", ["FoldSmoothQuant", "CalibrateOurs", "FitActivations", "SwapModules",
                               "SpecialTokenRows", "ReportRows"]),
    ("w4-gptq", ["SequentialGptq", "CalibrateOurs", "FitActivations", "SwapModules", "SpecialTokenRows",
                 "ReportRows"]),
    ("study-w8a8-pwlq", ["StudyCalibrate", "StudyActivations", "StudyW8"]),
    ("study-w8", ["StudyW8"]),
    ("study-a8-pwlq", ["StudyCalibrate", "StudyActivations"]),
])
def test_each_preset_lists_its_passes_in_pipeline_order(preset, expected):
    assert [type(p).__name__ for p in resolve_recipe(pp.get_preset(preset)).passes] == expected


def test_smoothquant_pwlq_plan_calibrates_every_chosen_site_after_the_fold(esm2):
    cfg = pp.get_preset("w8a8-smoothquant-pwlq")
    recipe = resolve_recipe(cfg)
    sites = recipe.choose(esm2, get_adapter(esm2), cfg)
    plan = plan_calibration(cfg, recipe.passes, sites)
    # PWLQ activations are static: every chosen linear and LayerNorm site is calibrated, with the recipe's spec
    assert {s.kind for s in plan.static} == {SiteKind.LINEAR, SiteKind.LAYERNORM}
    assert set(plan.specs) == {s.name for s in sites} and set(plan.specs.values()) == {cfg.activations}
    assert plan.why == "static activations and SmoothQuant" and plan.own_pass is not None
    assert plan.study is None and plan.shared is None and not plan.include_special


def test_shared_calibration_reads_the_plans_decision(esm2, seqs):
    passes, notes = calibrate_recipes(esm2, ["w8a8-pwlq", "w8a8-smoothquant-pwlq"], seqs)
    assert passes["w8a8-smoothquant-pwlq"] is None and "SmoothQuant" in notes["w8a8-smoothquant-pwlq"]
    with pytest.raises(ValueError, match="changes the model"):
        pp.quantize(esm2, "w8a8-smoothquant-pwlq", statistics=passes["w8a8-pwlq"])


class _CountSites:
    """A method added as one pass: it records how many sites were swapped."""

    @staticmethod
    def applies(cfg):
        return cfg.activations is not None

    def needs(self, cfg, sites):
        return Needs()

    def run(self, run):
        run.report.append({"site": "*", "swapped": len(run.quantized)})


def test_a_new_pass_is_one_class_and_its_place_in_the_pipeline(esm2, seqs, monkeypatch):
    monkeypatch.setattr(recipe_mod, "OUR_PASSES", recipe_mod.OUR_PASSES + (_CountSites,))
    qmodel = pp.quantize(esm2, "w8a8-uniform", calibration=seqs)
    assert qmodel.ptq_state.report[-1] == {"site": "*", "swapped": len(qmodel.ptq_state.quantized)}
    plain = pp.quantize(esm2, "w8-only", calibration=seqs)  # no activations: the pass does not apply
    assert all(row.get("site") != "*" for row in plain.ptq_state.report)


def test_study_recipes_skip_matmul_sites_ours_keep_them(esm2):
    adapter = get_adapter(esm2)
    all_sites = discover_sites(esm2, adapter)
    ours, study = pp.get_preset("w8a8-pwlq-all"), pp.get_preset("study-a8-pwlq")
    assert any(s.kind is SiteKind.MATMUL for s in resolve_recipe(ours).select(all_sites, ours))
    assert not any(s.kind is SiteKind.MATMUL for s in resolve_recipe(study).select(all_sites, study.replace(
        kinds=ours.kinds)))
