"""Pass: hold ESMFold's pair activations in int8 while it folds (``QuantConfig(pair_bits=8)``).

Needs: nothing (no calibration: the scales are per vector, taken at run time).
Reads: ``run.cfg.pair_bits``. Writes: ``run.model`` (its forward runs the trunk on an
int8 pair state, :mod:`ptq_protein.nn.pair_int8`). Last in both pipelines: the
calibration forwards before it see float pairs, as a chunk size would not change them
either; the config records ``pair_bits``, so a loaded artifact runs the same way.
"""

from __future__ import annotations

from ptq_protein.nn.pair_int8 import use_pair_int8
from ptq_protein.passes.base import EveryRecipe
from ptq_protein.passes.run import Run
from ptq_protein.recipes.config import QuantConfig

__all__ = ["PairInt8"]


class PairInt8(EveryRecipe):
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return cfg.pair_bits is not None

    def run(self, run: Run) -> None:
        use_pair_int8(run.model, run.cfg.pair_bits)
