"""Pass: the study's activation quantizers, from its observers' top-k bounds, attached at each site's input.

Needs: nothing of its own (the observers are the study calibrate pass's).
Reads: ``run.plan.sites``, ``run.observers``, ``cfg.activations`` (scheme, bits, top-k).
Writes: ``run.model`` (each site wrapped in ``QuantInput`` with a ``StudyActQuant``),
``run.quantized``, ``run.fp_sites`` (sites that never ran, or only saw zeros: the
study's assert; the warning says which, ``float_reason``) and ``run.report`` (one row per quantized site:
calls, bounds).
"""

from __future__ import annotations

import logging
from typing import Dict, List

from torch import nn

from ptq_protein.calibration.sites import set_module
from ptq_protein.nn.modules import QuantInput
from ptq_protein.nn.study import StudyActQuant
from ptq_protein.passes.base import EveryRecipe
from ptq_protein.passes.run import Run
from ptq_protein.quant.study_observer import float_reason
from ptq_protein.recipes.config import QuantConfig

__all__ = ["StudyActivations"]

log = logging.getLogger(__name__)


class StudyActivations(EveryRecipe):
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return cfg.study is not None and cfg.activations is not None

    def run(self, run: Run) -> None:
        acts = run.cfg.activations
        fp_why: Dict[str, List[str]] = {}
        for site in run.plan.sites:
            obs, bounds = run.observers[site.name], run.observers[site.name].bounds(acts.topk)
            why = float_reason(obs, acts.topk)  # never ran, or only zeros (their assert)
            if why is not None:
                run.fp_sites.append(site.name)
                fp_why.setdefault(why, []).append(site.name)
                continue
            quant = StudyActQuant(acts.scheme, acts.bits, *bounds).to(_device(run.model.get_submodule(site.name)))
            set_module(run.model, site.name, QuantInput(run.model.get_submodule(site.name), quant))
            run.quantized[site.name] = f"{site.kind.value} input ({acts.scheme.value})"
            run.report.append({"site": site.name, "kind": site.kind.value, "group": site.group, "calls": obs.seen,
                               "calls_used": obs.count, "min": float(bounds[0]), "max": float(bounds[1]),
                               "activation": acts.describe()})
        if run.fp_sites:
            log.warning("%d site(s) stay in floating point: %s", len(run.fp_sites), "; ".join(
                f"{why}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}" for why, names in fp_why.items()))


def _device(module: nn.Module):
    for tensor in list(module.parameters()) + list(module.buffers()):
        return tensor.device
    return "cpu"
