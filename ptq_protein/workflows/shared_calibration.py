"""One calibration pass for several recipes (``ptq-protein quantize --compare``).

Calibration is the costly part of quantizing, and its statistics are mostly
recipe-independent (see :mod:`ptq_protein.calibration.sharing`): recipes whose
per-site statistics agree are calibrated together, on the union of their sites,
in one pass; a recipe that needs different statistics at some site gets a pass
of its own, and the returned notes say why. The ``study-*`` recipes keep the
study's own statistics; their observers ride the first pass when its forwards
are the study's (one sequence each, in order, the model as it runs: ESMFold's
default), else they get a batch-1 pass of their own. What each recipe needs is
the plan ``pp.quantize`` makes for it (:func:`ptq_protein.passes.plan.plan_calibration`);
the forwards run where ``pp.quantize``'s do (:mod:`ptq_protein.passes.forwards`).

    passes, notes = calibrate_recipes(model, ["w8a8-pwlq", "w8a8-uniform"], "casp14:50")
    qmodels = {name: pp.quantize(model, name, statistics=passes[name]) for name in passes}
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

from torch import nn

from ptq_protein.api import CalibrationArg, CalibrationInfo, CalibrationPass, calibration_sequences
from ptq_protein.calibration.sharing import merge_collection_specs
from ptq_protein.calibration.sites import Site, discover_sites
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.mapped import mapped_file_of, release_after_forward
from ptq_protein.passes.forwards import run_forwards
from ptq_protein.passes.plan import CalibrationPlan, StudyWatch, plan_calibration, study_can_ride
from ptq_protein.passes.recipe import resolve_recipe
from ptq_protein.recipes.config import QuantConfig, TensorQuant
from ptq_protein.recipes.presets import resolve_config

__all__ = ["calibrate_recipes"]

log = logging.getLogger(__name__)


@dataclass
class _Group:
    """Recipes planned into one pass: the union of their sites and the specs that serve them all."""

    recipes: List[str] = field(default_factory=list)
    sites: Dict[str, Site] = field(default_factory=dict)
    specs: Dict[str, TensorQuant] = field(default_factory=dict)
    include_special: bool = False  # BOS/EOS rows in the statistics (special_tokens="include")


def calibrate_recipes(model: nn.Module, recipes: Sequence[Union[str, QuantConfig]], calibration: CalibrationArg, *,
                      batch_size: Optional[int] = None, progress: bool = False, num_recycles: Optional[int] = None,
                      calib_max_length: Optional[int] = None, inplace: bool = False
                      ) -> Tuple[Dict[str, Optional[CalibrationPass]], Dict[str, str]]:
    """Calibrate ``model`` once per group of recipes whose statistics agree.

    Returns ``(passes, notes)``: ``passes`` maps each recipe name to the
    :class:`CalibrationPass` to give ``pp.quantize(..., statistics=)`` (None when
    the recipe needs no calibration); ``notes`` maps a recipe that could not join
    an earlier pass to why (``"was calibrated in a pass of its own (...)"``), and
    a study recipe whose observers rode a pass of ours to which. ``model`` is not modified: passes run on a copy,
    or, with ``inplace`` (what ``pp.quantize(inplace=True)`` does next anyway), on
    ``model`` itself with the adapter's run-time settings applied to it, no second
    copy of the weights, and memory-mapped weights handed back after each layer's forward.
    """
    cfgs = [resolve_config(r) for r in recipes]
    names = [c.name for c in cfgs]
    if len(set(names)) != len(names):
        raise ValueError(f"recipe names must be distinct to share calibration, got {names}")
    adapter = get_adapter(model)
    all_sites = discover_sites(model, adapter)
    plans = [_recipe_plan(c, all_sites) for c in cfgs]
    study, notes = _plan_study(plans)
    groups, more_notes = _plan([p for p in plans if p.study is None])
    notes.update(more_notes)
    notes = {name: f"was calibrated in a pass of its own ({reason})" for name, reason in notes.items()}
    passes: Dict[str, Optional[CalibrationPass]] = {name: None for name in names}
    if not groups and study is None:
        return passes, notes
    rides = study is not None and bool(groups) and study_can_ride(model, adapter, batch_size)
    if rides:
        notes.update({name: f"keeps {STUDY_STATISTICS}, observed in the forwards of the pass of "
                            f"{', '.join(groups[0].recipes)}" for name in study.recipes})
    work = model if inplace else copy.deepcopy(model)
    adapter.prepare(work)
    with release_after_forward(work, mapped_file_of(work) if inplace else None):
        _run_passes(work, adapter, study, groups, passes, calibration, batch_size, progress, num_recycles,
                    calib_max_length, rides)
    return passes, notes


def _run_passes(work: nn.Module, adapter, study: Optional["_StudyGroup"], groups: Sequence["_Group"],
                passes: Dict[str, Optional[CalibrationPass]], calibration: CalibrationArg, batch_size: Optional[int],
                progress: bool, num_recycles: Optional[int], calib_max_length: Optional[int], rides: bool) -> None:
    """The planned passes over ``work``, each recipe's entry of ``passes`` filled in.

    With ``rides``, the study's observers join the first group's pass instead of a pass of their own.
    """
    name, seqs = calibration_sequences(adapter, calibration, calib_max_length)
    info = CalibrationInfo.for_sequences(name, seqs)
    run = dict(batch_size=batch_size, progress=progress,
               forward_kwargs={"num_recycles": num_recycles} if num_recycles is not None else {})
    if study is not None and not rides:
        log.info("calibrating once for %s (the study's pass: batch 1, whole tensors)", ", ".join(study.recipes))
        _, observers = run_forwards(work, adapter, seqs, study=study.watch(), **run)
        _fill(passes, CalibrationPass(info, {}, {}, list(study.recipes), study=observers))
    for i, group in enumerate(groups):
        riding = rides and i == 0
        log.info("calibrating once for %s%s", ", ".join(group.recipes),
                 f" and, in the same forwards, {', '.join(study.recipes)}" if riding else "")
        stats, observers = run_forwards(work, adapter, seqs, sites=list(group.sites.values()), specs=group.specs,
                                        include_special=group.include_special,
                                        study=study.watch() if riding else None, **run)
        if riding:
            _fill(passes, CalibrationPass(info, {}, {}, list(study.recipes), study=observers))
        _fill(passes, CalibrationPass(info, dict(group.specs), stats, list(group.recipes),
                                      include_special=group.include_special))


def _fill(passes: Dict[str, Optional[CalibrationPass]], shared: CalibrationPass) -> None:
    passes.update({recipe: shared for recipe in shared.recipes})


def _recipe_plan(cfg: QuantConfig, all_sites: Sequence[Site]) -> CalibrationPlan:
    """The plan ``pp.quantize`` makes for ``cfg`` on these sites (the one decision both read)."""
    recipe = resolve_recipe(cfg)
    return plan_calibration(cfg, recipe.passes, recipe.select(all_sites, cfg))


def _plan(plans: Sequence[CalibrationPlan]) -> Tuple[List[_Group], Dict[str, str]]:
    """First-fit grouping, in the given order, so the first recipe's pass serves as many as it can."""
    groups: List[_Group] = []
    notes: Dict[str, str] = {}
    for plan in plans:
        if plan.own_pass:
            if plan.why:  # it runs forwards of its own (a rotation alone, with dynamic activations, runs none)
                notes[plan.recipe] = plan.own_pass
            continue
        if not plan.static:
            continue
        reasons = []
        for group in groups:
            merged, reason = merge_collection_specs(group.specs, plan.specs)
            if group.include_special != plan.include_special:
                merged, reason = None, "one calibrates on the BOS/EOS rows too (special_tokens='include'), one not"
            if merged is not None:
                group.specs = merged
                break
            reasons.append(f"cannot share the pass of {', '.join(group.recipes)}: {reason}")
        else:
            group = _Group(include_special=plan.include_special)
            groups.append(group)
            group.specs = dict(plan.specs)
            if reasons:
                notes[plan.recipe] = "; ".join(reasons)
        group.recipes.append(plan.recipe)
        group.sites.update({s.name: s for s in plan.static})
    return groups, notes


@dataclass
class _StudyGroup:
    """The study-* recipes with activations: one batch-1 pass keeping enough extremes for each one's top-k."""

    calls: int
    recipes: List[str] = field(default_factory=list)
    sites: Dict[str, Site] = field(default_factory=dict)
    keep: int = 1

    def watch(self) -> StudyWatch:
        return StudyWatch(tuple(self.sites.values()), self.keep, self.calls)


STUDY_STATISTICS = "the study's own statistics (batch 1, first calls, BOS/EOS included)"
STUDY_OWN_PASS = f"a study-exact recipe collects {STUDY_STATISTICS}"


def _plan_study(plans: Sequence[CalibrationPlan]) -> Tuple[Optional[_StudyGroup], Dict[str, str]]:
    """One pass for every study-* recipe that calibrates with the first one's call count (the study's 50)."""
    group: Optional[_StudyGroup] = None
    notes: Dict[str, str] = {}
    for plan in plans:
        watch = plan.study
        if watch is None:
            continue
        if group is None:
            group = _StudyGroup(watch.calls)
        if watch.calls != group.calls:
            notes[plan.recipe] = f"{STUDY_OWN_PASS}; it counts {watch.calls} calls, the shared study pass {group.calls}"
            continue
        notes[plan.recipe] = STUDY_OWN_PASS + (f", shared with {', '.join(group.recipes)}" if group.recipes else "")
        group.recipes.append(plan.recipe)
        group.keep = max(group.keep, watch.keep)
        group.sites.update({s.name: s for s in watch.sites})
    return group, notes
