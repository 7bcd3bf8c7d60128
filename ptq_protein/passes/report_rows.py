"""Pass: the per-site report rows and the histograms kept for plots.

Needs: nothing. Reads: ``run.model``, ``run.plan.sites``, ``run.stats``, ``run.quants``, ``run.weight_sqnr``.
Writes: ``run.report`` (the artifact's ``report.json`` rows) and ``run.histograms``.
"""

from __future__ import annotations

from typing import Sequence

from ptq_protein.calibration.sites import Site
from ptq_protein.config import QuantConfig
from ptq_protein.passes.base import Needs
from ptq_protein.passes.run import Run
from ptq_protein.report import build_report

__all__ = ["ReportRows"]


class ReportRows:
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return True

    def needs(self, cfg: QuantConfig, sites: Sequence[Site]) -> Needs:
        return Needs()

    def run(self, run: Run) -> None:
        run.report = build_report(run.model, list(run.plan.sites), run.stats, run.quants, run.cfg, run.weight_sqnr)
        run.histograms = {name: st.histogram.support() for name, st in run.stats.items() if st.count}
