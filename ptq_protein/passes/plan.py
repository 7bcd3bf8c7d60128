"""The planner: one :class:`CalibrationPlan` per recipe, from what its passes need.

Every reader of "how does this recipe calibrate" reads this plan: ``pp.quantize``'s
passes, the shared calibration of several recipes
(:mod:`ptq_protein.workflows.shared_calibration`), streaming
(:mod:`ptq_protein.workflows.streaming`) and the search workbench.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

from torch import nn

from ptq_protein.calibration.sites import Site
from ptq_protein.nn.qparams import needs_calibration
from ptq_protein.passes.base import Pass
from ptq_protein.passes.sequences import CalibrationArg, calibration_sequences
from ptq_protein.passes.state import CalibrationInfo, CalibrationPass
from ptq_protein.recipes.config import QuantConfig, SiteKind, SpecialTokens, TensorQuant

__all__ = ["CalibrationPlan", "StudyWatch", "plan_calibration", "static_sites", "study_can_ride", "MODEL_CHANGES_FIRST"]

MODEL_CHANGES_FIRST = "rotate_ffn/SmoothQuant/GPTQ change the model before its activations are calibrated"


@dataclass(frozen=True)
class StudyWatch:
    """The study's observers: at ``sites``, the top-``keep`` extremes of the first ``calls`` calls (batch 1)."""

    sites: Tuple[Site, ...]
    keep: int
    calls: int


@dataclass(frozen=True)
class CalibrationPlan:
    """How one recipe calibrates, decided once before any forward runs.

    ``static`` sites get our statistics, collected with ``specs`` (BOS/EOS rows
    in them when ``include_special``); ``study`` says what the study's observers
    watch. ``why`` is why sequences are needed ("" for none). ``own_pass`` is why
    a shared pass of the float model cannot serve the recipe (None: it can).
    ``shared`` is the shared pass the recipe reads instead of calibrating.
    """

    recipe: str
    sites: Tuple[Site, ...]
    static: Tuple[Site, ...] = ()
    specs: Dict[str, TensorQuant] = field(default_factory=dict)
    include_special: bool = False
    study: Optional[StudyWatch] = None
    why: str = ""
    own_pass: Optional[str] = None
    shared: Optional[CalibrationPass] = None

    def calibration_input(self, adapter, calibration: CalibrationArg,
                          max_length: Optional[int]) -> Tuple[Optional[CalibrationInfo], List[str]]:
        """(what was calibrated on, the sequences to run): the shared pass's record, or the caller's sequences."""
        if self.shared is not None:
            return self.shared.info, []
        if not self.why:
            return None, []
        name, seqs = calibration_sequences(adapter, calibration, max_length, self.why)
        return CalibrationInfo.for_sequences(name, seqs), seqs


def plan_calibration(cfg: QuantConfig, passes: Sequence[Pass], sites: Sequence[Site],
                     statistics: Optional[CalibrationPass] = None) -> CalibrationPlan:
    """The plan of ``cfg``'s ``passes`` over its chosen ``sites``; refuses a ``statistics`` pass that cannot serve it.

    ``why`` names the readers of statistics first ("static activations and SmoothQuant"), then the transforms.
    """
    needs = [p.needs(cfg, sites) for p in passes]
    static = tuple(static_sites(sites, cfg)) if any(n.statistics for n in needs) else ()
    study = None
    if any(n.study_observers for n in needs):
        study = StudyWatch(tuple(sites), cfg.activations.topk, cfg.study.calls)
    readers_first = sorted((n for n in needs if n.sequences), key=lambda n: not (n.statistics or n.study_observers))
    plan = CalibrationPlan(cfg.name, tuple(sites), static, specs={s.name: cfg.activation_for(s.name) for s in static},
                           include_special=cfg.special_tokens is SpecialTokens.INCLUDE, study=study,
                           why=" and ".join(n.sequences for n in readers_first),
                           own_pass=MODEL_CHANGES_FIRST if any(n.changes_model for n in needs) else None)
    if statistics is None:
        return plan
    reason = _why_not_served(plan, statistics, cfg)
    if reason is not None:
        raise ValueError(reason)
    return plan if not (static or study) else replace(plan, shared=statistics)


def static_sites(chosen: Sequence[Site], cfg: QuantConfig) -> List[Site]:
    """The chosen sites whose activation quantizers need calibration statistics."""
    if cfg.activations is None:
        return []
    # MATMUL sub-sites (operands of each product) are discovered by calibration, so they always calibrate.
    return [s for s in chosen if needs_calibration(cfg.activation_for(s.name)) or s.kind is SiteKind.MATMUL]


def study_can_ride(model: nn.Module, adapter, batch_size: Optional[int]) -> bool:
    """True when a pass of ours sees exactly the study pass's forwards, so its hooks can share them.

    That is one sequence a forward in the given order (:meth:`ModelAdapter.batches`
    at batch 1) with the model as it runs (calibration mode changes nothing), the
    study's pass. Its observers then see the very tensors of a pass of their own:
    one pass's forwards instead of two, the same statistics bit for bit.
    """
    return adapter.batch_size(batch_size) == 1 and adapter.calibrates_as_it_runs(model)


def _why_not_served(plan: CalibrationPlan, statistics: CalibrationPass, cfg: QuantConfig) -> Optional[str]:
    if plan.own_pass is not None:
        return (f"recipe {cfg.name!r} changes the model (rotate_ffn/SmoothQuant/GPTQ) before its activations are "
                "calibrated, so a shared calibration pass cannot serve it; pass calibration= instead")
    reason = None
    if plan.static:
        reason = statistics.reason_not_serving(plan.static, cfg)
    elif plan.study is not None:
        reason = statistics.reason_not_serving_study(plan.study.sites, cfg)
    if reason is None:
        return None
    return (f"the calibration pass given as statistics= cannot serve recipe {cfg.name!r}: {reason}; "
            "plan it with calibrate_recipes, or pass calibration= instead")

