"""Pass: fold SmoothQuant's per-channel scales into the model copy (``QuantConfig.smoothquant``).

Needs: calibration sequences (its own forwards measure each linear input's
channel ranges); it changes the model before activations are calibrated.
Reads: ``run.model``, ``run.seqs``, the chosen linear sites, ``run.batch_size``, ``run.forward_kwargs``.
Writes: ``run.model`` (each smoothed linear's weight times the scales, the LayerNorm
or linear feeding it divided by them). Records: nothing beyond the config.
"""

from __future__ import annotations

from typing import Sequence

from ptq_protein.calibration.sites import Site
from ptq_protein.passes.base import Needs
from ptq_protein.passes.run import Run
from ptq_protein.recipes.config import QuantConfig
from ptq_protein.transforms.smoothquant import smooth_model_

__all__ = ["FoldSmoothQuant"]


class FoldSmoothQuant:
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return cfg.smoothquant is not None

    def needs(self, cfg: QuantConfig, sites: Sequence[Site]) -> Needs:
        return Needs(sequences="SmoothQuant", changes_model=True)

    def run(self, run: Run) -> None:
        smooth_model_(run.model, run.adapter, run.seqs, run.cfg.smoothquant, linears=set(run.linear_names),
                      batch_size=run.batch_size, forward_kwargs=run.forward_kwargs, progress=run.progress)
