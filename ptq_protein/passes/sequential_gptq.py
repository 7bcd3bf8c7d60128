"""Pass: GPTQ, layer by layer, over the chosen linears of the model copy (``QuantConfig.gptq``).

Needs: calibration sequences (its own sequential forwards collect each linear's
Hessian); it changes the model before activations are calibrated.
Reads: ``run.model``, ``run.seqs``, the chosen linear sites, ``cfg.weights``, ``cfg.gptq``.
Writes: ``run.model`` (each linear's weight replaced by its GPTQ-rounded values),
``run.weight_codes`` (the integer codes and scales the swap then uses) and
``run.gptq_sqnr`` (each weight's SQNR against its float values, measured as GPTQ rounds it: the report's).
"""

from __future__ import annotations

from typing import Sequence

from ptq_protein.calibration.sites import Site
from ptq_protein.passes.base import Needs
from ptq_protein.passes.run import Run
from ptq_protein.recipes.config import QuantConfig
from ptq_protein.transforms.gptq_pass import gptq_model_

__all__ = ["SequentialGptq"]


class SequentialGptq:
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return cfg.gptq is not None

    def needs(self, cfg: QuantConfig, sites: Sequence[Site]) -> Needs:
        return Needs(sequences="GPTQ", changes_model=True)

    def run(self, run: Run) -> None:
        names = run.linear_names
        run.weight_codes = gptq_model_(run.model, run.adapter, names, run.cfg.weights, run.cfg.gptq, run.seqs,
                                       batch_size=run.batch_size, forward_kwargs=run.forward_kwargs,
                                       progress=run.progress, sqnr=run.gptq_sqnr)
