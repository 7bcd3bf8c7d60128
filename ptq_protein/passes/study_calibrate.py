"""Pass: the study's calibration, top-k observers at module inputs (``study-*`` recipes with activations).

Needs: calibration sequences; the study's observers at the plan's sites (batch
1, whole tensors, BOS/EOS included: the study's own pass, as in their notebook).
Reads: ``run.plan`` (``study``: sites, top-k kept, calls counted; ``shared``), ``run.model``
(float: the study calibrates before anything is swapped), ``run.seqs``, ``run.forward_kwargs``.
Writes: ``run.observers`` (site -> StudyTopKObserver).
"""

from __future__ import annotations

from typing import Sequence

from ptq_protein.calibration.sites import Site
from ptq_protein.passes.base import STATIC_ACTIVATIONS, Needs
from ptq_protein.passes.forwards import run_forwards
from ptq_protein.passes.run import Run
from ptq_protein.recipes.config import QuantConfig

__all__ = ["StudyCalibrate"]


class StudyCalibrate:
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return cfg.study is not None and cfg.activations is not None

    def needs(self, cfg: QuantConfig, sites: Sequence[Site]) -> Needs:
        return Needs(sequences=STATIC_ACTIVATIONS, study_observers=True)

    def run(self, run: Run) -> None:
        if run.plan.shared is not None:
            run.observers = run.plan.shared.study
            return
        _, run.observers = run_forwards(run.model, run.adapter, run.seqs, study=run.plan.study,
                                        progress=run.progress, forward_kwargs=run.forward_kwargs)
