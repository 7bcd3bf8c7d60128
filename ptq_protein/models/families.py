"""What a loaded model is (its library and head), and what an unpickled checkpoint file holds."""

from __future__ import annotations

import enum
from typing import Any

from ptq_protein.models.esmc_load import is_esmc_state

__all__ = ["ModelFamily", "file_family"]


class ModelFamily(str, enum.Enum):
    """Which library and head a loaded model is."""

    FAIR_ESM = "fair-esm"  # esm.model.esm2.ESM2 (or ESM-1b/1v ProteinBertModel)
    HF_ESM = "hf-esm"  # transformers EsmForMaskedLM
    HF_ESMFOLD = "hf-esmfold"  # transformers EsmForProteinFolding
    ESMC = "esmc"  # ptq_protein.models.esmc.ESMC (EvolutionaryScale's ESM C, the official weights)


def file_family(data: Any) -> ModelFamily:
    """What an unpickled ``.pt`` file holds: ESM C's state, ESMFold's (a folding trunk), else an ESM-2 (whose
    load refuses, in words, a file that is none of them)."""
    if is_esmc_state(data):
        return ModelFamily.ESMC
    state = data.get("model") if isinstance(data, dict) else None
    folding = isinstance(state, dict) and any(str(k).startswith("trunk.") for k in state)
    return ModelFamily.HF_ESMFOLD if folding else ModelFamily.FAIR_ESM
