"""``pp.quantize``: a named recipe or config through :func:`ptq_protein.api.quantize`, ``"auto"`` through the search.

Lives above the API so that ``pp.quantize(model, "auto", budget=...)`` can reach
:func:`ptq_protein.search.auto.auto_quantize` without the API importing upward.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from torch import nn

from ptq_protein import api
from ptq_protein.config import QuantConfig
from ptq_protein.errors import InputError

__all__ = ["quantize", "AUTO"]

AUTO = "auto"


def quantize(model: nn.Module, config: Union[str, QuantConfig, dict] = "w8a8-pwlq", calibration: Any = None, *,
             budget: Optional[str] = None, max_bits_avg: Optional[float] = None, **kwargs: Any) -> nn.Module:
    """Quantize ``model`` with a recipe (see :func:`ptq_protein.api.quantize`) or, with ``config="auto"``,
    search a per-unit precision plan meeting ``budget`` / ``max_bits_avg``
    (see :func:`ptq_protein.search.auto.auto_quantize` for the other keywords).

    Example
    -------
    >>> qmodel = quantize(model, "auto", calibration="casp14:50", budget="tm>=0.99")  # doctest: +SKIP
    >>> qmodel.ptq_state.plan.avg_bits                                                # doctest: +SKIP
    """
    if isinstance(config, str) and config == AUTO:
        from ptq_protein.search.auto import auto_quantize

        return auto_quantize(model, budget, max_bits_avg=max_bits_avg, calibration=calibration, **kwargs)
    if budget is not None or max_bits_avg is not None:
        raise InputError("budget= and max_bits_avg= only apply to the automatic search: pass config='auto'")
    return api.quantize(model, config, calibration, **kwargs)
