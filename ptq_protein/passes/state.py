"""What a quantize run records: the calibration set, a reusable calibration pass, and the result's ``ptq_state``.

These are the records the passes write (:mod:`ptq_protein.passes.run`) and the
artifact saves; :mod:`ptq_protein.api` re-exports them under their old names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from ptq_protein.calibration.sites import Site
from ptq_protein.recipes.config import QuantConfig, SpecialTokens, TensorQuant

__all__ = ["CalibrationInfo", "QuantState", "CalibrationPass"]


@dataclass
class CalibrationInfo:
    """What the activations were calibrated on (recorded in the artifact's recipe)."""

    name: str
    num_sequences: int
    sha256: str

    @classmethod
    def for_sequences(cls, name: str, sequences: Sequence[str]) -> "CalibrationInfo":
        return cls(name, len(sequences), _sequences_sha(sequences))

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "num_sequences": self.num_sequences, "sha256": self.sha256}


@dataclass
class QuantState:
    """Everything needed to describe, save and reload a quantized model."""

    config: QuantConfig
    family: str
    sites: List[Site]
    quantized: Dict[str, str]
    calibration: Optional[CalibrationInfo]
    report: List[Dict[str, Any]] = field(default_factory=list)
    fp_sites: List[str] = field(default_factory=list)
    histograms: Dict[str, Any] = field(default_factory=dict)  # site -> (counts, edges), for plots
    plan: Optional[Any] = None  # a ptq_protein.recipes.site_plan.MixedPlan when the precision differs per unit


@dataclass
class CalibrationPass:
    """The statistics of one calibration pass, which several recipes may read.

    ``specs`` are the per-site specs the statistics were collected with (see
    :mod:`ptq_protein.calibration.sharing`); ``recipes`` names the recipes this
    pass was planned for (made by :func:`ptq_protein.workflows.shared_calibration.calibrate_recipes`).
    """

    info: CalibrationInfo
    specs: Dict[str, TensorQuant]
    stats: Dict[str, Any]  # site (or MATMUL sub-site) name -> SiteStats
    recipes: List[str] = field(default_factory=list)
    study: Dict[str, Any] = field(default_factory=dict)  # site -> StudyTopKObserver, for study-* recipes
    include_special: bool = False  # BOS/EOS rows were in the statistics (special_tokens="include")

    def reason_not_serving_study(self, sites: Sequence[Site], cfg: QuantConfig) -> Optional[str]:
        """Why this pass cannot stand in for the study calibration of ``sites`` under ``cfg`` (None: it can)."""
        for site in sites:
            obs = self.study.get(site.name)
            if obs is None:
                return f"site {site.name} was not calibrated with the study's statistics in this pass"
            if obs.calls != cfg.study.calls or obs.keep < cfg.activations.topk:
                return (f"site {site.name}: this pass kept the top-{obs.keep} of the first {obs.calls} calls; "
                        f"the recipe needs top-{cfg.activations.topk} of the first {cfg.study.calls}")
        return None

    def reason_not_serving(self, sites: Sequence[Site], cfg: QuantConfig) -> Optional[str]:
        """Why this pass cannot stand in for calibrating ``sites`` under ``cfg`` (None: it can)."""
        from ptq_protein.calibration.sharing import StatsNeeds

        if (cfg.special_tokens is SpecialTokens.INCLUDE) != self.include_special:
            return (f"the pass {'included' if self.include_special else 'left out'} the BOS/EOS rows; the recipe's "
                    f"special_tokens is {cfg.special_tokens.value!r}")
        for site in sites:
            have = self.specs.get(site.name)
            if have is None:
                return f"site {site.name} was not calibrated in this pass"
            if not StatsNeeds.of(cfg.activation_for(site.name)).covered_by(StatsNeeds.of(have)):
                return f"site {site.name}: its statistics were collected for another range ({have.describe()})"
        return None

    def stats_for(self, sites: Sequence[Site]) -> Dict[str, Any]:
        """The statistics of ``sites`` only (MATMUL sites: their operand sub-sites)."""
        names = {s.name for s in sites}
        return {k: st for k, st in self.stats.items() if k in names or k.split("@", 1)[0] in names}


def _sequences_sha(seqs: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for s in seqs:
        digest.update(s.encode("ascii", "replace") + b"\n")
    return digest.hexdigest()
