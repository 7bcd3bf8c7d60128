"""SmoothQuant's migration strength alpha, chosen per model.

Xiao et al. (2023, Sec. 4 and Fig. 10) pick alpha per model by a grid search on
held-out data: too small leaves the activation outliers in place, too large moves
them into the weights. Here each alpha of the grid quantizes the model with the
recipe (calibrated as usual) and is scored by the relative error of the model's
main output against the FP model on the scoring sequences; the smallest error
wins (ties go to the alpha nearest the paper's 0.5). The grid's ``None`` is no
smoothing at all: on some models (attention sinks) smoothing the attention's inputs
moves error into the weights that every query's logits then feel, and the recipe
without it is the more accurate. Costs one ``quantize`` and one forward per
sequence for each point on the grid.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, List, Optional, Sequence, Tuple, Union

from torch import nn

from ptq_protein.api import quantize
from ptq_protein.eval.bench.fidelity import compare_to_reference, reference_outputs
from ptq_protein.models.adapters import get_adapter
from ptq_protein.recipes.config import QuantConfig
from ptq_protein.recipes.presets import resolve_config
from ptq_protein.support.errors import InputError

__all__ = ["AlphaTrial", "DEFAULT_ALPHAS", "search_smoothquant_alpha"]

log = logging.getLogger(__name__)

DEFAULT_ALPHAS = (None, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # no smoothing, and the range the paper sweeps
_PAPER_ALPHA = 0.5


@dataclasses.dataclass(frozen=True)
class AlphaTrial:
    """One grid point: alpha (None: no smoothing) and the relative error of the quantized model's output against
    FP."""

    alpha: Optional[float]
    relative_error: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def search_smoothquant_alpha(model: nn.Module, recipe: Union[str, QuantConfig, dict], sequences: Sequence[str], *,
                             alphas: Sequence[Optional[float]] = DEFAULT_ALPHAS, **quantize_kwargs: Any
                             ) -> Tuple[QuantConfig, List[AlphaTrial]]:
    """``(recipe with the best alpha, or without SmoothQuant where None won; every trial)``; ``quantize_kwargs``
    go to :func:`ptq_protein.api.quantize`.

    ``sequences`` score each alpha (held-out ones are best; the calibration set's
    median-length ones are what ``ptq-protein quantize --smoothquant-alpha auto`` uses).
    ``model`` is never modified.
    """
    cfg = resolve_config(recipe)
    if cfg.smoothquant is None:
        raise InputError(f"recipe {cfg.name!r} has no SmoothQuant step to tune: pick a *-smoothquant* preset")
    if not alphas or any(a is not None and not 0.0 <= a <= 1.0 for a in alphas):
        raise InputError(f"alphas {list(alphas)} must be a non-empty list of values in [0, 1] (or None: off)")
    references = reference_outputs(model, list(sequences))
    adapter = get_adapter(model)
    trials = []
    for alpha in alphas:
        qmodel = quantize(model, _at(cfg, alpha), **quantize_kwargs)
        error = compare_to_reference(qmodel, references, adapter)["relative_error"]
        del qmodel
        trials.append(AlphaTrial(None if alpha is None else float(alpha), float(error)))
        log.info("smoothquant alpha %s: relative error %.4g", "off" if alpha is None else f"{alpha:.2f}", error)
    best = min(trials, key=lambda t: (t.relative_error, 1.0 if t.alpha is None else abs(t.alpha - _PAPER_ALPHA)))
    return _at(cfg, best.alpha), trials


def _at(cfg: QuantConfig, alpha: Optional[float]) -> QuantConfig:
    """``cfg`` smoothed with ``alpha``, or without SmoothQuant (None)."""
    if alpha is None:
        return cfg.replace(smoothquant=None)
    return cfg.replace(smoothquant=dataclasses.replace(cfg.smoothquant, alpha=float(alpha)))
