"""Pass: our calibration, statistics at the recipe's static sites (or read from a shared pass).

Needs: calibration sequences when any chosen site has static activations; our
per-site statistics (:mod:`ptq_protein.calibration.calibrate`) at the plan's ``static`` sites.
Reads: ``run.plan`` (``static``, ``specs``, ``include_special``, ``shared``),
``run.model`` as the earlier passes left it, ``run.seqs``, ``run.batch_size``, ``run.mapped``.
Writes: ``run.stats`` (site, or MATMUL sub-site ``site@operand`` -> SiteStats).
Memory-mapped weights are handed back after each layer's forward.
"""

from __future__ import annotations

from typing import Sequence

from ptq_protein.calibration.sites import Site
from ptq_protein.models.mapped import release_after_forward
from ptq_protein.passes.base import STATIC_ACTIVATIONS, Needs
from ptq_protein.passes.forwards import run_forwards
from ptq_protein.passes.plan import static_sites
from ptq_protein.passes.run import Run
from ptq_protein.recipes.config import QuantConfig

__all__ = ["CalibrateOurs"]


class CalibrateOurs:
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return True

    def needs(self, cfg: QuantConfig, sites: Sequence[Site]) -> Needs:
        return Needs(sequences=STATIC_ACTIVATIONS if static_sites(sites, cfg) else "", statistics=True)

    def run(self, run: Run) -> None:
        plan = run.plan
        if not plan.static:
            return
        if plan.shared is not None:
            run.stats = plan.shared.stats_for(plan.static)
            return
        with release_after_forward(run.model, run.mapped):
            run.stats, _ = run_forwards(run.model, run.adapter, run.seqs, sites=plan.static, specs=plan.specs,
                                        include_special=plan.include_special, batch_size=run.batch_size,
                                        progress=run.progress, forward_kwargs=run.forward_kwargs)
