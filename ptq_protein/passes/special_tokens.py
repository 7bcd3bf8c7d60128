"""Pass: BOS/EOS rows as the recipe says (``QuantConfig.special_tokens``; ours keep them in float).

Needs: nothing. Reads: ``run.model`` (its activation quantizers), ``run.adapter``, ``run.cfg``.
Writes: ``run.model`` (the quantizers point at the special-token context).
"""

from __future__ import annotations

from ptq_protein.nn.special_tokens import apply_special_tokens_
from ptq_protein.passes.base import EveryRecipe
from ptq_protein.passes.run import Run

__all__ = ["SpecialTokenRows"]


class SpecialTokenRows(EveryRecipe):
    def run(self, run: Run) -> None:
        apply_special_tokens_(run.model, run.adapter, run.cfg)
