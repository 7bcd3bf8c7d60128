"""fair-esm predict.py's scoring strategies, by name: torch-free, so ``--help`` stays fast."""

from __future__ import annotations

import enum

__all__ = ["Strategy", "DEFAULT_TOKS_PER_BATCH"]

DEFAULT_TOKS_PER_BATCH = 4096  # as ptq-protein embed (fair-esm extract.py's default)


class Strategy(str, enum.Enum):
    """predict.py's ``--scoring-strategy`` choices (see :mod:`ptq_protein.workloads.variant_scores`)."""

    WT_MARGINALS = "wt-marginals"
    MASKED_MARGINALS = "masked-marginals"
    PSEUDO_PPL = "pseudo-ppl"

    @classmethod
    def parse(cls, value: "str | Strategy") -> "Strategy":
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown scoring strategy {value!r}; choose from "
                             f"{', '.join(s.value for s in cls)}") from None

    @property
    def marginal(self) -> bool:
        """Scores read from one table of per-position log-probabilities of the wild type."""
        return self is not Strategy.PSEUDO_PPL
