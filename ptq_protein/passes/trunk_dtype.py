"""Pass: run the pair operations of ESMFold's trunk in bfloat16 (``QuantConfig(trunk_dtype="bfloat16")``).

Needs: nothing (no calibration: nothing in the trunk is quantized by it).
Reads: ``run.cfg.trunk_dtype``. Writes: ``run.model`` (its trunk pair operations' Linear weights held in
bfloat16, those operations run under bfloat16 autocast where the device has it: :mod:`ptq_protein.nn.trunk_dtype`).
Last, as :class:`~ptq_protein.passes.pair_int8.PairInt8`: the calibration forwards before it see the float
trunk; the config records ``trunk_dtype``, so a loaded artifact runs the same way.
"""

from __future__ import annotations

from torch import nn

from ptq_protein.nn.trunk_dtype import use_trunk_dtype
from ptq_protein.passes.base import EveryRecipe
from ptq_protein.passes.run import Run
from ptq_protein.recipes.config import QuantConfig
from ptq_protein.support.errors import InputError

__all__ = ["TrunkDtype"]


class TrunkDtype(EveryRecipe):
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return cfg.trunk_dtype is not None

    def check(self, model: nn.Module, adapter, cfg: QuantConfig) -> None:
        if not hasattr(getattr(model, "trunk", None), "blocks"):
            raise InputError(f"recipe {cfg.name!r} runs ESMFold's folding trunk in {cfg.trunk_dtype} "
                             f"(trunk_dtype), but {type(model).__name__} has no trunk: use it on an ESMFold model, "
                             "or a recipe without trunk_dtype (e.g. w8a8-pwlq)")

    def run(self, run: Run) -> None:
        use_trunk_dtype(run.model, run.cfg.trunk_dtype)
