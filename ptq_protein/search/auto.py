"""Automatic mixed precision under a budget: ``pp.quantize(model, "auto", budget="tm>=0.99")``.

The search, in four steps (calibration runs once, before step 1):

1. **Table.** For every unit u and every choice c of the menu, quantize u alone at c (the
   rest FP) and measure the budget's metric on the *search* sequences: loss(u, c)
   (0 = the FP model's own output; 1 - TM, 1 - precision, 1 - top-1, or the logits' relative error).
2. **Greedy.** Start all-FP. Repeatedly take the move (u -> c) that lowers the average
   width (:mod:`ptq_protein.recipes.site_plan`) at the smallest increase of the predicted loss
   (the sum of the plan's table losses) per bit saved, down to the narrowest plan (or,
   with ``max_bits_avg``, until the plan is that narrow). The moves form a list of
   nested plans, each narrower than the one before.
3. **Choose and verify.** Bisect that list for the longest prefix whose *measured* metric
   (the whole plan at once, on the search sequences) meets the bound; then measure it on
   *held-out* sequences and, if the bound fails there, back off (bisect again on held-out
   over the shorter prefixes) until it holds.
4. **Build.** Swap the chosen modules into a copy of the model; the plan (unit ->
   choice, sites, budget, verified values) is its ``ptq_state.plan`` and goes into ``recipe.json``.

A budget no plan with a quantized unit meets is an error naming the best value reached.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from torch import nn

from ptq_protein.api import crop_sequence, resolve_calibration
from ptq_protein.models.adapters import get_adapter
from ptq_protein.passes.float_source import require_float
from ptq_protein.recipes.config import Backend, QuantConfig, SiteKind, TensorQuant
from ptq_protein.recipes.site_plan import DEFAULT_CHOICES, MixedPlan, UnitChoice
from ptq_protein.search.budget import VALUE_METRIC, Budget
from ptq_protein.search.metrics import METRIC_VALUES, Metric, Scorer, choose_metric
from ptq_protein.search.units import Unit, UnitKind, make_units
from ptq_protein.search.workbench import SiteSpec, Workbench
from ptq_protein.support.errors import InputError

__all__ = ["auto_quantize", "SearchLog", "unit_specs", "UnitCosts", "single_width_baselines", "AUTO_SCOPE",
           "AUTO_CONFIG"]

log = logging.getLogger(__name__)

#: Sites the search may quantize: Linear (weights and inputs) and LayerNorm inputs, heads excluded (the
#: activation spec only makes site selection keep LayerNorm sites; each unit's choice gives the real specs).
AUTO_SCOPE = QuantConfig(weights=None, activations=TensorQuant(bits=8), kinds=(SiteKind.LINEAR, SiteKind.LAYERNORM),
                         name="auto")
#: The config an auto artifact records: the precision lives in the per-site entries and the plan.
AUTO_CONFIG = QuantConfig(weights=None, activations=None, kinds=(SiteKind.LINEAR, SiteKind.LAYERNORM), name="auto")
_FP = UnitChoice()


@dataclass
class SearchLog:
    """What the search did: the table, the greedy's moves, the verification and back-off."""

    metric: str
    table: Dict[Tuple[str, str], float] = field(default_factory=dict)
    moves: List[Tuple[str, str, float, float]] = field(default_factory=list)  # unit, choice, avg bits, predicted loss
    verified: Dict[int, Dict[str, float]] = field(default_factory=dict)  # prefix length -> held-out values
    kept: int = 0
    timing: Dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"metric": self.metric, "moves": [list(m) for m in self.moves], "kept_moves": self.kept,
                "verified": {str(k): v for k, v in self.verified.items()}, "timing": self.timing,
                "table": [{"unit": u, "choice": c, "loss": v} for (u, c), v in self.table.items()]}


class UnitCosts:
    """Each unit's share of the average width, so a move's new width is one subtraction and one addition."""

    def __init__(self, units: Sequence[Unit], weight_numel: Dict[str, int]):
        w_total = sum(weight_numel.values())
        a_total = sum(len(u.sites) for u in units)
        self._w = {u.name: sum(weight_numel.get(s, 0) for s in u.site_names) / w_total if w_total else 0.0
                   for u in units}
        self._a = {u.name: len(u.sites) / a_total for u in units}

    def share(self, unit: str, choice: UnitChoice) -> float:
        wb, ab = choice.bits()
        return 0.5 * (self._w[unit] * wb + self._a[unit] * ab)

    def total(self, plan: Dict[str, UnitChoice]) -> float:
        return sum(self.share(u, c) for u, c in plan.items())


def unit_specs(units: Sequence[Unit], plan: Dict[str, UnitChoice]) -> Dict[str, SiteSpec]:
    """Site -> (weights, activations) of a unit -> choice plan (FP units and empty specs left out)."""
    specs: Dict[str, SiteSpec] = {}
    for u in units:
        choice = plan.get(u.name, _FP)
        for site in u.sites:
            spec = (choice.weight_spec() if site.kind is SiteKind.LINEAR else None, choice.act_spec())
            if spec != (None, None):
                specs[site.name] = spec
    return specs


def auto_quantize(model: nn.Module, budget: Union[str, Budget, None] = None, *, max_bits_avg: Optional[float] = None,
                  calibration: Any = None, search_set: Any = "cameo139:5", holdout: Any = "cameo2022:5",
                  unit: Union[str, UnitKind] = "layer", choices: Sequence[UnitChoice] = DEFAULT_CHOICES,
                  metric: Optional[str] = None, backend: Optional[str] = None, batch_size: Optional[int] = None,
                  num_recycles: Optional[int] = None, max_length: Optional[int] = None) -> nn.Module:
    """The narrowest per-unit precision plan found that meets ``budget`` on held-out sequences (module docstring).

    Parameters
    ----------
    budget : ``"tm>=0.99"``, ``"logits_rel<=0.02"``, ... or a :class:`Budget`; ``max_bits_avg`` bounds the width.
    calibration : as for :func:`ptq_protein.quantize` (required).
    search_set, holdout : sequences the table is measured on, and those the plan is verified on.
    unit : ``layer`` (default), ``site`` or ``part``.
    choices : the menu (:data:`ptq_protein.recipes.site_plan.DEFAULT_CHOICES`); FP is always offered.
    metric : with only ``max_bits_avg``: what to keep close to FP (default ``tm`` for ESMFold, ``logits`` for LMs).
    max_length : crop calibration / search / held-out sequences to this many central residues.

    Returns
    -------
    The quantized copy; ``qmodel.ptq_state.plan`` is the :class:`MixedPlan`, ``qmodel.ptq_search`` the
    :class:`SearchLog`.
    """
    budget = budget if isinstance(budget, Budget) else Budget.parse(budget, max_bits_avg)
    family = get_adapter(model).family
    require_float(model)
    chosen_metric = choose_metric(family, metric, budget.metric)
    value_name = budget.value_name or next(iter(METRIC_VALUES[chosen_metric]))
    menu = tuple(dict.fromkeys([_FP, *choices]))
    search_seqs = [crop_sequence(s, max_length) for s in resolve_calibration(search_set)[1]]
    held_seqs = [crop_sequence(s, max_length) for s in resolve_calibration(holdout)[1]]
    resolve_calibration(calibration)  # fail on a missing calibration set before calibrating anything
    start = time.perf_counter()
    bench = Workbench(model, AUTO_SCOPE, calibration, batch_size=batch_size, num_recycles=num_recycles,
                      calib_max_length=max_length, backend=Backend(backend or "fake"))
    search = Scorer(bench.model, bench.adapter, chosen_metric, search_seqs, bench.forward_kwargs)
    held = Scorer(bench.model, bench.adapter, chosen_metric, held_seqs, bench.forward_kwargs)
    units = make_units(bench.sites, unit)
    costs = UnitCosts(units, bench.weight_numel())
    record = SearchLog(value_name)
    loss = budget.loss_of if budget.value_name else (lambda values: 1.0 - values[value_name]
                                                      if chosen_metric is not Metric.LOGITS else values[value_name])
    record.timing["setup_s"] = time.perf_counter() - start
    record.table = _table(bench, search, units, menu, loss)
    record.timing["table_s"] = time.perf_counter() - start - record.timing["setup_s"]
    record.moves = _greedy(units, menu, record.table, costs, budget)
    plan = _choose_prefix(bench, search, held, units, record, budget, value_name)
    record.timing["total_s"] = time.perf_counter() - start
    avg = costs.total(plan)
    if budget.max_bits_avg is not None and avg > budget.max_bits_avg + 1e-9:
        raise InputError(f"no precision plan meets {budget.text}: the narrowest plan that keeps the metric bound "
                         f"averages {avg:.2f} bits; allow more bits or add narrower choices (--choices all)")
    mixed = MixedPlan(tuple((u.name, plan[u.name].name, u.site_names) for u in units), budget.text, avg,
                      tuple(record.verified[record.kept].items()))
    qmodel = bench.build(unit_specs(units, plan), AUTO_CONFIG.replace(backend=bench.backend), plan=mixed)
    qmodel.ptq_search = record
    return qmodel


def _table(bench: Workbench, scorer: Scorer, units: Sequence[Unit], menu: Sequence[UnitChoice],
           loss) -> Dict[Tuple[str, str], float]:
    table: Dict[Tuple[str, str], float] = {}
    for u in units:
        table[(u.name, _FP.name)] = 0.0
        for choice in menu:
            if choice.is_fp:
                continue
            with bench.applied(unit_specs([u], {u.name: choice})) as model:
                table[(u.name, choice.name)] = loss(scorer.score(model))
        log.info("unit %s: %s", u.name, {c.name: round(table[(u.name, c.name)], 5) for c in menu})
    return table


def _greedy(units: Sequence[Unit], menu: Sequence[UnitChoice], table, costs: UnitCosts,
            budget: Budget) -> List[Tuple[str, str, float, float]]:
    plan = {u.name: _FP for u in units}
    width, predicted, moves = costs.total(plan), 0.0, []
    while budget.max_bits_avg is None or width > budget.max_bits_avg + 1e-9:
        best = None
        for u in units:
            here = plan[u.name]
            for choice in menu:
                new_width = width - costs.share(u.name, here) + costs.share(u.name, choice)
                if new_width >= width - 1e-12:
                    continue
                new_loss = predicted - table[(u.name, here.name)] + table[(u.name, choice.name)]
                rate = (new_loss - predicted) / (width - new_width)
                if best is None or rate < best[0]:
                    best = (rate, u.name, choice, new_width, new_loss)
        if best is None:
            break
        _, name, choice, width, predicted = best
        plan[name] = choice
        moves.append((name, choice.name, width, predicted))
    return moves


def _plan_after(units: Sequence[Unit], moves, k: int) -> Dict[str, UnitChoice]:
    plan = {u.name: _FP for u in units}
    for name, choice, _, _ in moves[:k]:
        plan[name] = UnitChoice.parse(choice)
    return plan


def _longest_holding_prefix(holds, n: int) -> int:
    """Largest k in [0, n] with ``holds(k)``, by bisection (``holds(0)``, all FP, is taken as true)."""
    if n == 0 or holds(n):
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo


def _choose_prefix(bench: Workbench, search: Scorer, held: Scorer, units: Sequence[Unit], record: SearchLog,
                   budget: Budget, value_name: str) -> Dict[str, UnitChoice]:
    """Longest greedy prefix meeting the bound measured on the search sequences, then backed off on held-out."""
    def measure(scorer: Scorer, store: Dict[int, Dict[str, float]], k: int) -> bool:
        if k not in store:
            with bench.applied(unit_specs(units, _plan_after(units, record.moves, k))) as model:
                store[k] = scorer.score(model)
        return budget.metric_holds(store[k])

    searched: Dict[int, Dict[str, float]] = {}
    n = _longest_holding_prefix(lambda k: measure(search, searched, k), len(record.moves))
    n = _longest_holding_prefix(lambda k: measure(held, record.verified, k), n)
    if n == 0:
        raise InputError(_unmet_message(record, budget, value_name, searched))
    record.kept = n
    log.info("kept %d of %d greedy moves; held-out %s", n, len(record.moves), record.verified[n])
    return _plan_after(units, record.moves, n)


def _unmet_message(record: SearchLog, budget: Budget, value_name: str, searched: Dict[int, Dict[str, float]]) -> str:
    higher = VALUE_METRIC[value_name][1]
    measured = [(v[value_name], where) for store, where in ((record.verified, "on the held-out sequences"),
                                                            (searched, "on the search sequences"))
                for k, v in store.items() if k > 0]
    if not measured:
        return (f"no plan with a quantized unit meets the budget {budget.text}: the search made no move; "
                "offer more choices")
    best, where = (max if higher else min)(measured, key=lambda item: item[0])
    return (f"no plan with a quantized unit meets the budget {budget.text}: the best reached is "
            f"{value_name}={best:.4g} "
            f"{where}; relax the budget or offer more choices")



def single_width_baselines(bench: Workbench, scorer: Scorer, units: Sequence[Unit], menu: Sequence[UnitChoice],
                           costs: UnitCosts) -> List[Dict[str, Any]]:
    """Every unit at the same choice (a preset's plan): its average width and metric values on ``scorer``."""
    rows = []
    for choice in menu:
        plan = {u.name: choice for u in units}
        with bench.applied(unit_specs(units, plan)) as model:
            rows.append({"choice": choice.name, "avg_bits": costs.total(plan), **scorer.score(model)})
    return rows
