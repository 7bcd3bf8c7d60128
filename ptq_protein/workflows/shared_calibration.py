"""One calibration pass for several recipes (``ptq-protein quantize --compare``).

Calibration is the costly part of quantizing, and its statistics are mostly
recipe-independent (see :mod:`ptq_protein.calibration.sharing`): recipes whose
per-site statistics agree are calibrated together, on the union of their sites,
in one pass; a recipe that needs different statistics at some site gets a pass
of its own, and the returned notes say why. The ``study-*`` recipes keep the
study's own statistics; their observers ride the first pass when its forwards
are the study's (one sequence each, in order, the model as it runs: ESMFold's
default), else they get a batch-1 pass of their own.

    passes, notes = calibrate_recipes(model, ["w8a8-pwlq", "w8a8-uniform"], "casp14:50")
    qmodels = {name: pp.quantize(model, name, statistics=passes[name]) for name in passes}
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

from torch import nn

from ptq_protein.api import CalibrationArg, CalibrationInfo, CalibrationPass, calibration_sequences, static_sites
from ptq_protein.calibration.calibrate import calibrate
from ptq_protein.calibration.sharing import merge_collection_specs
from ptq_protein.calibration.sites import Site, discover_sites, select_sites
from ptq_protein.calibration.study import study_calibrate, study_observers
from ptq_protein.config import QuantConfig, SiteKind, SpecialTokens, TensorQuant
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.mapped import mapped_file_of, release_after_forward
from ptq_protein.presets import resolve_config

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
    study, notes = _plan_study(cfgs, all_sites)
    groups, more_notes = _plan([c for c in cfgs if c.study is None], all_sites)
    notes.update(more_notes)
    notes = {name: f"was calibrated in a pass of its own ({reason})" for name, reason in notes.items()}
    passes: Dict[str, Optional[CalibrationPass]] = {name: None for name in names}
    if not groups and study is None:
        return passes, notes
    rides = study is not None and bool(groups) and _study_can_ride(model, adapter, batch_size)
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
    extra = {"num_recycles": num_recycles} if num_recycles is not None else {}
    if study is not None and not rides:
        log.info("calibrating once for %s (the study's pass: batch 1, whole tensors)", ", ".join(study.recipes))
        observers = study_calibrate(work, adapter, list(study.sites.values()), seqs, study.keep, study.calls, extra,
                                    progress)
        _fill(passes, CalibrationPass(info, {}, {}, list(study.recipes), study=observers))
    for i, group in enumerate(groups):
        riding = rides and i == 0
        log.info("calibrating once for %s%s", ", ".join(group.recipes),
                 f" and, in the same forwards, {', '.join(study.recipes)}" if riding else "")
        with (study_observers(work, list(study.sites.values()), study.keep, study.calls) if riding
              else contextlib.nullcontext()) as observers:
            stats = calibrate(work, adapter, list(group.sites.values()), group.specs, seqs, batch_size=batch_size,
                              progress=progress, forward_kwargs=extra, include_special=group.include_special)
        if riding:
            _fill(passes, CalibrationPass(info, {}, {}, list(study.recipes), study=observers))
        _fill(passes, CalibrationPass(info, dict(group.specs), stats, list(group.recipes),
                                      include_special=group.include_special))


def _study_can_ride(model: nn.Module, adapter, batch_size: Optional[int]) -> bool:
    """True when a pass of ours sees exactly the study pass's forwards, so its hooks can share them.

    That is one sequence a forward in the given order (:meth:`ModelAdapter.batches`
    at batch 1) with the model as it runs (calibration mode changes nothing), the
    study's pass. Its observers then see the very tensors of a pass of their own:
    one pass's forwards instead of two, the same statistics bit for bit.
    """
    return adapter.batch_size(batch_size) == 1 and adapter.calibrates_as_it_runs(model)


def _fill(passes: Dict[str, Optional[CalibrationPass]], shared: CalibrationPass) -> None:
    passes.update({recipe: shared for recipe in shared.recipes})


def _plan(cfgs: Sequence[QuantConfig], all_sites: Sequence[Site]) -> Tuple[List[_Group], Dict[str, str]]:
    """First-fit grouping, in the given order, so the first recipe's pass serves as many as it can."""
    groups: List[_Group] = []
    notes: Dict[str, str] = {}
    for cfg in cfgs:
        own = _calibrates_on_its_own(cfg)
        if own:
            notes[cfg.name] = own
            continue
        sites = static_sites(select_sites(all_sites, cfg), cfg)
        if not sites:
            continue
        wanted = {s.name: cfg.activations for s in sites}
        include = cfg.special_tokens is SpecialTokens.INCLUDE
        reasons = []
        for group in groups:
            merged, reason = merge_collection_specs(group.specs, wanted)
            if group.include_special != include:
                merged, reason = None, "one calibrates on the BOS/EOS rows too (special_tokens='include'), one not"
            if merged is not None:
                group.specs = merged
                break
            reasons.append(f"cannot share the pass of {', '.join(group.recipes)}: {reason}")
        else:
            group = _Group(include_special=include)
            groups.append(group)
            group.specs = dict(wanted)
            if reasons:
                notes[cfg.name] = "; ".join(reasons)
        group.recipes.append(cfg.name)
        group.sites.update({s.name: s for s in sites})
    return groups, notes


@dataclass
class _StudyGroup:
    """The study-* recipes with activations: one batch-1 pass keeping enough extremes for each one's top-k."""

    calls: int
    recipes: List[str] = field(default_factory=list)
    sites: Dict[str, Site] = field(default_factory=dict)
    keep: int = 1


STUDY_STATISTICS = "the study's own statistics (batch 1, first calls, BOS/EOS included)"
STUDY_OWN_PASS = f"a study-exact recipe collects {STUDY_STATISTICS}"


def _plan_study(cfgs: Sequence[QuantConfig], all_sites: Sequence[Site]) -> Tuple[Optional[_StudyGroup], Dict[str, str]]:
    """One pass for every study-* recipe that calibrates with the first one's call count (the study's 50)."""
    group: Optional[_StudyGroup] = None
    notes: Dict[str, str] = {}
    for cfg in cfgs:
        if cfg.study is None or cfg.activations is None:
            continue
        if group is None:
            group = _StudyGroup(cfg.study.calls)
        if cfg.study.calls != group.calls:
            notes[cfg.name] = f"{STUDY_OWN_PASS}; it counts {cfg.study.calls} calls, the shared study pass " \
                              f"{group.calls}"
            continue
        notes[cfg.name] = STUDY_OWN_PASS + (f", shared with {', '.join(group.recipes)}" if group.recipes else "")
        group.recipes.append(cfg.name)
        group.keep = max(group.keep, cfg.activations.topk)
        group.sites.update({s.name: s for s in select_sites(all_sites, cfg) if s.kind is not SiteKind.MATMUL})
    return group, notes


def _calibrates_on_its_own(cfg: QuantConfig) -> Optional[str]:
    """Why a recipe cannot read a shared pass (None: it can)."""
    if cfg.changes_model_before_calibration:
        return "SmoothQuant/GPTQ change the model before its activations are calibrated"
    return None
