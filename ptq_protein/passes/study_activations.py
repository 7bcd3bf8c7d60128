"""Pass: the study's activation quantizers, from its observers' top-k bounds, attached at each site's input.

Needs: nothing of its own (the observers are the study calibrate pass's).
Reads: ``run.plan.sites``, ``run.observers``, ``cfg.activations`` (scheme, bits, top-k).
Writes: ``run.model`` (each site wrapped in ``QuantInput`` with a ``StudyActQuant``),
``run.quantized``, ``run.fp_sites`` (sites that never ran, or only saw zeros: the
study's assert) and ``run.report`` (one row per quantized site: calls, bounds).
"""

from __future__ import annotations

import logging

from torch import nn

from ptq_protein.calibration.sites import set_module
from ptq_protein.config import QuantConfig
from ptq_protein.nn.modules import QuantInput
from ptq_protein.nn.study import StudyActQuant
from ptq_protein.passes.base import EveryRecipe
from ptq_protein.passes.run import Run

__all__ = ["StudyActivations"]

log = logging.getLogger(__name__)


class StudyActivations(EveryRecipe):
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return cfg.study is not None and cfg.activations is not None

    def run(self, run: Run) -> None:
        acts = run.cfg.activations
        for site in run.plan.sites:
            obs, bounds = run.observers[site.name], run.observers[site.name].bounds(acts.topk)
            if bounds is None or float(bounds[0]) >= 0.0 >= float(bounds[1]):  # never ran, or always 0 (their assert)
                run.fp_sites.append(site.name)
                continue
            quant = StudyActQuant(acts.scheme, acts.bits, *bounds).to(_device(run.model.get_submodule(site.name)))
            set_module(run.model, site.name, QuantInput(run.model.get_submodule(site.name), quant))
            run.quantized[site.name] = f"{site.kind.value} input ({acts.scheme.value})"
            run.report.append({"site": site.name, "kind": site.kind.value, "group": site.group, "calls": obs.seen,
                               "calls_used": obs.count, "min": float(bounds[0]), "max": float(bounds[1]),
                               "activation": acts.describe()})
        if run.fp_sites:
            log.warning("%d site(s) never ran during calibration and stay in floating point: %s", len(run.fp_sites),
                        ", ".join(run.fp_sites[:5]) + (" ..." if len(run.fp_sites) > 5 else ""))


def _device(module: nn.Module):
    for tensor in list(module.parameters()) + list(module.buffers()):
        return tensor.device
    return "cpu"
