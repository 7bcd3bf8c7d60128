"""The one check that a model given to be quantized (or used as the FP reference) is still float.

A quantized model (``pp.quantize``'s or ``pp.load``'s result, or an HF-layout artifact
loaded with ``from_pretrained``) looks like any ESM model from outside; quantizing it again
stacks a second recipe on the first, and using it as "fp" makes every fidelity number
compare quantized with quantized. ``pp.quantize``, the search and the sensitivity scan call
:func:`require_float`; the CLI's model loader calls it too, and words a refused artifact
folder with :func:`already_quantized`, so every entry says the same thing.
"""

from __future__ import annotations

from typing import Optional

from torch import nn

from ptq_protein.calibration.matmul_sites import QuantMatmulHost
from ptq_protein.nn.modules import QuantInput, QuantLinear
from ptq_protein.nn.study import StudyActQuant
from ptq_protein.support.errors import InputError

__all__ = ["quantized_recipe", "require_float", "already_quantized"]

_QUANTIZED = (QuantLinear, QuantInput, QuantMatmulHost, StudyActQuant)
_BY_HAND = "quantized modules"


def quantized_recipe(model: nn.Module) -> Optional[str]:
    """The recipe ``model`` was quantized with (``"quantized modules"`` when unrecorded), or None if it is float."""
    state = getattr(model, "ptq_state", None)
    if state is not None:
        return getattr(getattr(state, "config", None), "name", None) or _BY_HAND
    return _BY_HAND if any(isinstance(m, _QUANTIZED) for m in model.modules()) else None


def require_float(model: nn.Module, what: str = "this model") -> None:
    """Refuse (InputError) a model that already holds quantized modules, naming its recipe and the fix."""
    recipe = quantized_recipe(model)
    if recipe is not None:
        recipe_info = getattr(model, "ptq_recipe", None) or {}
        source = recipe_info.get("model") if isinstance(recipe_info, dict) else None
        raise InputError(already_quantized(what, recipe, source.get("name") if isinstance(source, dict) else None))


def already_quantized(what: str, recipe: Optional[str], source: Optional[str]) -> str:
    """The one-line refusal: what is quantized, with which recipe, and what to pass instead."""
    model = f"its source model ({source})" if source else "its float source model"
    return (f"{what} is already quantized ({recipe or _BY_HAND}); quantize or evaluate {model} instead "
            "(an artifact runs as it is with pp.load, embed, score or fold)")
