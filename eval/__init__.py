"""Structure and contact evaluators: TM-score, GDT, RMSD, lDDT, contact precision.

Public names are imported on first use, so ``import ptq_protein.eval`` stays cheap::

    from ptq_protein.eval import load_structure, tm_score, contact_precision
    from ptq_protein.eval.lddt import lddt  # the function shares its module's name: import it from there
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Structure": "structure", "load_structure": "structure",
    "Pairing": "align", "global_align": "align", "pair_residues": "align",
    "TMScoreResult": "tmscore", "tm_score": "tmscore", "tm_score_batch": "tmscore",
    "LDDTResult": "lddt",
    "contact_map": "contacts", "contact_precision": "contacts", "virtual_cb": "contacts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ptq_protein.eval' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ptq_protein.eval.{module}"), name)
