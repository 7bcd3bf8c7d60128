"""The study's contact experiment: quantize ESM-2, predict contacts of structural-split domains, mean P@L.

Calibration on the first training domains (the study: 50, ``fold`` level,
partition 4), evaluation on the validation domains, per-domain precisions from
:func:`~ptq_protein.eval.bench.structural_split.study_contact_precisions`
averaged over domains (theirs: a plain mean over the 4090 validation domains).
"""

from __future__ import annotations

import logging
import math
from typing import Dict, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ptq_protein.eval.bench.contacts_task import predict_contacts
from ptq_protein.eval.bench.structural_split import Domain, study_contact_precisions

__all__ = ["evaluate_study_contacts", "study_contact_configs"]

log = logging.getLogger(__name__)


def study_contact_configs() -> Dict[str, object]:
    """{label: recipe} of the study's contact rows, study-exact, and ours beside them.

    Their contact runs differ from the structure ones: uniform A8 took top-3
    (``quant_activation_normal.ipynb#cell12-20``) and W8 rounded *every* key of the
    ESM-2 state dict (``contact .../quant_weight.ipynb#cell9-15``), embeddings,
    LM head and contact regression included.
    """
    import ptq_protein as pp
    from ptq_protein.recipes.config import StudyOptions

    uniform = pp.get_preset("study-a8-uniform")
    return {
        "FP32": "fp",
        "uniform A8 (study-exact, top-3)": uniform.replace(
            activations=uniform.activations.__class__(**{**uniform.activations.to_dict(), "topk": 3}),
            name="study-a8-uniform-top3"),
        "W8 (study-exact, every key)": pp.get_preset("study-w8").replace(
            study=StudyOptions(weight_prefixes=("",)), name="study-w8-all-keys"),
        "uniform A8 (ours: a8-uniform)": "a8-uniform",
        "W8 (ours: w8-only)": "w8-only",
    }


@torch.no_grad()
def evaluate_study_contacts(model: nn.Module, recipes: Mapping[str, object], train: Sequence[Domain],
                            valid: Sequence[Domain]) -> Dict[str, Dict[str, float]]:
    """{label: {metric: mean over valid domains}} for each recipe (a preset name or a QuantConfig)."""
    import ptq_protein as pp

    calibration = [d.seq for d in train]
    results: Dict[str, Dict[str, float]] = {}
    for label, recipe in recipes.items():
        qmodel = model if recipe == "fp" else pp.quantize(model, recipe, calibration=calibration)
        qmodel.eval()
        per_domain = [study_contact_precisions(predict_contacts(qmodel, d.seq), d.dist) for d in valid]
        results[label] = {k: _nanmean([p[k] for p in per_domain]) for k in per_domain[0]} if per_domain else {}
        log.info("contacts %s: local P@L %.4f", label, results[label].get("local_P@L", math.nan))
    return results


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan
