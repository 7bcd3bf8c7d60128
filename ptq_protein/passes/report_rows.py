"""Pass: the per-site report rows and the histograms kept for plots.

Needs: nothing. Reads: ``run.model``, ``run.plan.sites``, ``run.stats``, ``run.quants``, ``run.weight_sqnr``.
Writes: ``run.report`` (the artifact's ``report.json`` rows) and ``run.histograms``.
"""

from __future__ import annotations

from ptq_protein.passes.base import EveryRecipe
from ptq_protein.passes.run import Run
from ptq_protein.passes.site_report import build_report

__all__ = ["ReportRows"]


class ReportRows(EveryRecipe):
    def run(self, run: Run) -> None:
        run.report = build_report(run.model, list(run.plan.sites), run.stats, run.quants, run.cfg, run.weight_sqnr)
        run.histograms = {name: st.histogram.support() for name, st in run.stats.items() if st.count}
