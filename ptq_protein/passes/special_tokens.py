"""Pass: BOS/EOS rows as the recipe says (``QuantConfig.special_tokens``; ours keep them in float).

Needs: nothing. Reads: ``run.model`` (its activation quantizers), ``run.adapter``, ``run.cfg``.
Writes: ``run.model`` (the quantizers point at the special-token context).
"""

from __future__ import annotations

from typing import Sequence

from ptq_protein.calibration.sites import Site
from ptq_protein.config import QuantConfig
from ptq_protein.nn.special_tokens import apply_special_tokens_
from ptq_protein.passes.base import Needs
from ptq_protein.passes.run import Run

__all__ = ["SpecialTokenRows"]


class SpecialTokenRows:
    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return True

    def needs(self, cfg: QuantConfig, sites: Sequence[Site]) -> Needs:
        return Needs()

    def run(self, run: Run) -> None:
        apply_special_tokens_(run.model, run.adapter, run.cfg)
