"""Pass: swap the chosen sites' modules for quantized ones (weights rounded, activation quantizers attached).

Needs: nothing of its own.
Reads: ``run.plan.sites``, ``run.quants``, ``run.weight_codes`` (GPTQ's, when it ran),
``run.originals``, ``run.cfg``, ``run.mapped``.
Writes: ``run.model`` (modules replaced; memory-mapped float weights handed back as
each is swapped), ``run.quantized`` (site -> what was done) and ``run.weight_sqnr``
(against the float originals when GPTQ overwrote the copy's weights).
"""

from __future__ import annotations

import torch

from ptq_protein.nn.convert import swap_modules_
from ptq_protein.passes.base import EveryRecipe
from ptq_protein.passes.run import Run
from ptq_protein.quant.metrics import sqnr_db

__all__ = ["SwapModules"]


class SwapModules(EveryRecipe):
    def run(self, run: Run) -> None:
        release = None if run.mapped is None else (lambda old: run.mapped.release(old.parameters()))
        run.quantized = swap_modules_(run.model, {s.name: s for s in run.plan.sites}, run.quants, run.cfg,
                                      run.weight_codes, run.weight_sqnr, release)
        for name, weight in run.originals.items():
            run.weight_sqnr[name] = sqnr_db(weight, run.model.get_submodule(name).dequantized_weight(torch.float32))
