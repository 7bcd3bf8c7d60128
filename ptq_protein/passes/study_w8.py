"""Pass: the study's W8, rounding the state dict's tensors under its prefixes (``study-*`` recipes with weights).

Runs after the activation quantizers are attached, as in their notebook, so it
rounds those quantizers' range buffers too. Needs: nothing.
Reads: ``run.model``, ``cfg.study`` (prefixes), ``cfg.weights.bits``.
Writes: ``run.model`` (tensors rounded in place) and ``run.quantized`` (tensor -> "W8 ...").
"""

from __future__ import annotations

from ptq_protein.nn.study import study_weights_
from ptq_protein.passes.base import EveryRecipe
from ptq_protein.passes.run import Run
from ptq_protein.recipes.config import QuantConfig

__all__ = ["StudyW8"]


class StudyW8(EveryRecipe):
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return cfg.study is not None and cfg.weights is not None

    def run(self, run: Run) -> None:
        bits = run.cfg.weights.bits
        run.quantized.update({k: f"W{bits} {how}" for k, how in study_weights_(run.model, run.cfg.study, bits).items()})
