"""Pass: rotate ESM C's SwiGLU products online by Hadamard blocks (``QuantConfig.rotate_ffn``), first of all.

Needs: nothing (no calibration); it changes the model before SmoothQuant, GPTQ and calibration, which must all
see the rotated products and weights. :meth:`RotateFfnProduct.check` refuses, before anything runs, a model
with no SwiGLU of ours (every family but ESM C) and a block that does not divide the product's width.
Reads: ``run.model``, ``run.adapter``, ``cfg.rotate_ffn``.
Writes: ``run.model`` (each SwiGLU's ``rotation``, each ``ffn.3`` weight ``W H``); the artifact records the
rotation in its architecture (``ffn_rotation``), so the loaded model rotates as the quantized one did.
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

from ptq_protein.calibration.sites import Site
from ptq_protein.passes.base import Needs
from ptq_protein.passes.run import Run
from ptq_protein.recipes.config import QuantConfig
from ptq_protein.transforms.rotation import rotate_ffn_product_, rotation_sites

__all__ = ["RotateFfnProduct"]


class RotateFfnProduct:
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return cfg.rotate_ffn > 0

    def needs(self, cfg: QuantConfig, sites: Sequence[Site]) -> Needs:
        return Needs(changes_model=True)

    def check(self, model: nn.Module, adapter, cfg: QuantConfig) -> None:
        rotation_sites(model, cfg.rotate_ffn, adapter)

    def run(self, run: Run) -> None:
        rotate_ffn_product_(run.model, run.cfg.rotate_ffn, run.adapter)
