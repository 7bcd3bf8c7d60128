"""Which recipes can share one calibration pass: what a site's statistics hold per spec.

A :class:`~ptq_protein.calibration.calibrate.SiteStats` always keeps float64
moments and the growing histogram; what else it keeps depends on the spec:
per-channel or per-tensor min/max (``granularity``), and a top-k observer with
its ``k`` only when the range comes from the top-k median. Bits, scheme,
symmetry, breakpoints, percentile and MSE search are all chosen *after*
calibration from those statistics. So two specs can read one pass when their
min/max granularity agrees and they do not ask for different ``k``; the pass then
collects with the spec that keeps the top-k observer (a superset of the other's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from ptq_protein.recipes.config import Granularity, RangeMethod, TensorQuant

__all__ = ["StatsNeeds", "merge_collection_specs"]


@dataclass(frozen=True)
class StatsNeeds:
    """The observers a spec's statistics must hold (all else is shared by every spec)."""

    per_channel: bool
    topk: Optional[int] = None  # k of the top-k observer, None when the range does not use it

    @classmethod
    def of(cls, spec: TensorQuant) -> "StatsNeeds":
        return cls(per_channel=spec.granularity is Granularity.PER_CHANNEL,
                   topk=spec.topk if spec.range_method is RangeMethod.TOPK else None)

    def covered_by(self, collected: "StatsNeeds") -> bool:
        """Whether statistics collected for ``collected`` hold everything this spec reads."""
        return self.per_channel == collected.per_channel and self.topk in (None, collected.topk)

    def conflict(self, other: "StatsNeeds") -> Optional[str]:
        """Why one pass cannot serve both (None when it can)."""
        if self.per_channel != other.per_channel:
            return "per-channel and per-tensor activation ranges keep different min/max statistics"
        if self.topk is not None and other.topk is not None and self.topk != other.topk:
            return f"top-k ranges with different k ({self.topk} and {other.topk}) keep different top-k statistics"
        return None


def _collection_spec(a: TensorQuant, b: TensorQuant) -> TensorQuant:
    """A spec whose statistics serve both ``a`` and ``b`` (already checked compatible)."""
    if StatsNeeds.of(a).topk is not None or StatsNeeds.of(b).topk is None:
        return a
    return dataclasses.replace(a, range_method=RangeMethod.TOPK, topk=b.topk)


def merge_collection_specs(group: Dict[str, TensorQuant],
                           recipe: Dict[str, TensorQuant]) -> Tuple[Optional[Dict[str, TensorQuant]], Optional[str]]:
    """Per-site collection specs of ``group`` widened to serve ``recipe`` too.

    Returns ``(merged, None)``, or ``(None, reason)`` naming the first site whose
    statistics cannot be shared. Sites only one side calibrates are simply added
    (one pass with more hooks is still one forward pass).
    """
    merged = dict(group)
    for name, spec in recipe.items():
        if name not in merged:
            merged[name] = spec
            continue
        reason = StatsNeeds.of(merged[name]).conflict(StatsNeeds.of(spec))
        if reason is not None:
            return None, f"site {name}: {reason}"
        merged[name] = _collection_spec(merged[name], spec)
    return merged, None
