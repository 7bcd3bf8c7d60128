"""The record one ``quantize`` call's passes share, and the ``ptq_state`` it becomes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from torch import nn

from ptq_protein.passes.plan import CalibrationPlan
from ptq_protein.passes.state import CalibrationInfo, QuantState
from ptq_protein.recipes.config import QuantConfig, SiteKind

__all__ = ["Run"]


@dataclass
class Run:
    """The model copy, the plan, the run options, and the fields the passes write.

    Inputs (set by the driver): ``model`` (the copy the passes change),
    ``adapter``, ``cfg``, ``plan``, ``seqs`` and ``calibration`` (the planned
    sequences and their record), ``batch_size``, ``progress``, ``forward_kwargs``
    and ``mapped`` (memory-mapped weights to hand back, or None).
    Written by the passes: ``stats`` / ``observers`` (calibration), ``weight_codes``
    and ``gptq_sqnr`` (GPTQ), ``quants`` and ``fp_sites`` (activation quantizers),
    ``quantized`` and ``weight_sqnr`` (the swap), ``report`` and ``histograms``.
    """

    model: nn.Module
    adapter: Any
    cfg: QuantConfig
    plan: CalibrationPlan
    seqs: List[str] = field(default_factory=list)
    calibration: Optional[CalibrationInfo] = None
    batch_size: Optional[int] = None
    progress: bool = False
    forward_kwargs: Dict[str, Any] = field(default_factory=dict)
    mapped: Any = None
    stats: Dict[str, Any] = field(default_factory=dict)
    observers: Dict[str, Any] = field(default_factory=dict)
    weight_codes: Dict[str, Any] = field(default_factory=dict)
    gptq_sqnr: Dict[str, float] = field(default_factory=dict)
    quants: Dict[str, Any] = field(default_factory=dict)
    fp_sites: List[str] = field(default_factory=list)
    quantized: Dict[str, str] = field(default_factory=dict)
    weight_sqnr: Dict[str, float] = field(default_factory=dict)
    report: List[Dict[str, Any]] = field(default_factory=list)
    histograms: Dict[str, Any] = field(default_factory=dict)

    @property
    def linear_names(self) -> List[str]:
        """The chosen linear sites (what SmoothQuant and GPTQ change)."""
        return [s.name for s in self.plan.sites if s.kind is SiteKind.LINEAR]

    def state(self) -> QuantState:
        """The quantization record the driver attaches as ``qmodel.ptq_state``."""
        return QuantState(self.cfg, self.adapter.family, list(self.plan.sites), self.quantized, self.calibration,
                          self.report, self.fp_sites, self.histograms)
