"""Pass: swap the chosen sites' modules for quantized ones (weights rounded, activation quantizers attached).

Needs: nothing of its own.
Reads: ``run.plan.sites``, ``run.quants``, ``run.weight_codes`` (GPTQ's, when it ran),
``run.gptq_sqnr``, ``run.cfg``, ``run.mapped``.
Writes: ``run.model`` (modules replaced; memory-mapped float weights handed back as
each is swapped), ``run.quantized`` (site -> what was done) and ``run.weight_sqnr``
(GPTQ's own, against the float weights, where it overwrote the copy's weights).
"""

from __future__ import annotations

from ptq_protein.nn.convert import swap_modules_
from ptq_protein.passes.base import EveryRecipe
from ptq_protein.passes.run import Run

__all__ = ["SwapModules"]


class SwapModules(EveryRecipe):
    def run(self, run: Run) -> None:
        release = None if run.mapped is None else (lambda old: run.mapped.release(old.parameters()))
        run.quantized = swap_modules_(run.model, {s.name: s for s in run.plan.sites}, run.quants, run.cfg,
                                      run.weight_codes, run.weight_sqnr, release)
        run.weight_sqnr.update(run.gptq_sqnr)
