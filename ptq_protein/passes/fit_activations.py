"""Pass: fit each chosen site's activation quantizer from the calibration statistics.

Needs: nothing of its own (the statistics are the calibrate pass's).
Reads: ``run.plan`` (``sites``, ``static``), ``run.stats``, ``cfg.activations``.
Writes: ``run.quants`` (site, or MATMUL sub-site -> quantizer) and ``run.fp_sites``
(static sites that never saw a residue: left in floating point, with a warning).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Sequence

from ptq_protein.calibration.sites import Site
from ptq_protein.nn.modules import ActQuantizer
from ptq_protein.nn.qparams import activation_quantizer
from ptq_protein.passes.base import EveryRecipe
from ptq_protein.passes.run import Run
from ptq_protein.recipes.config import QuantConfig, SiteKind

__all__ = ["FitActivations", "fit_activation_quantizers"]

log = logging.getLogger(__name__)


class FitActivations(EveryRecipe):
    def run(self, run: Run) -> None:
        act_sites = list(run.plan.sites) if run.cfg.activations is not None else []
        run.quants, run.fp_sites = fit_activation_quantizers(run.cfg, act_sites, run.plan.static, run.stats)


def fit_activation_quantizers(cfg: QuantConfig, act_sites: Sequence[Site], to_calibrate: Sequence[Site],
                              stats: Dict[str, Any]) -> tuple:
    """({site: quantizer}, [sites left in floating point]) from calibration statistics."""
    quants: Dict[str, ActQuantizer] = {}
    fp_sites = []
    for site in act_sites:
        if site.kind is SiteKind.MATMUL:
            subs = {k: st for k, st in stats.items() if k.startswith(f"{site.name}@") and st.count}
            quants.update({k: activation_quantizer(cfg.activation_for(site.name), st) for k, st in subs.items()})
            if not subs:
                fp_sites.append(site.name)
            continue
        site_stats = stats.get(site.name)
        if site in to_calibrate and (site_stats is None or site_stats.count == 0):
            fp_sites.append(site.name)
            continue
        quants[site.name] = activation_quantizer(cfg.activation_for(site.name), site_stats)
    if fp_sites:
        log.warning("%d site(s) never saw a residue during calibration and stay in floating point: %s",
                    len(fp_sites), ", ".join(fp_sites[:5]) + (" ..." if len(fp_sites) > 5 else ""))
    return quants, fp_sites
