"""SmoothQuant (Xiao et al. 2023): fold per-channel smoothing factors into LayerNorm -> Linear pairs.

For each pair the model adapter knows (:meth:`ModelAdapter.smoothing_pairs`),
the LayerNorm's weight and bias are divided by ``s`` and every Linear reading its
output gets its weight columns multiplied by ``s``; the float model computes the
same function, while the Linear inputs' per-channel ranges are flattened.
``s`` comes from the per-channel absolute maxima of the Linear input over residue
positions (padding and special tokens out) and of the Linears' weight columns.
"""

from __future__ import annotations

import logging
from typing import Collection, Dict, Optional, Sequence

import torch
from torch import nn

from ptq_protein.calibration.calibrate import calibrate
from ptq_protein.calibration.sites import Site
from ptq_protein.models.adapters import ModelAdapter
from ptq_protein.quant.smoothing import smoothing_factors
from ptq_protein.recipes.config import Granularity, SiteKind, SmoothQuantSpec, TensorQuant

__all__ = ["smooth_model_", "input_channel_absmax"]

log = logging.getLogger(__name__)

_PER_CHANNEL = TensorQuant(bits=8, granularity=Granularity.PER_CHANNEL)


def input_channel_absmax(model: nn.Module, adapter: ModelAdapter, names: Sequence[str], sequences: Sequence[str],
                         batch_size: Optional[int] = None, forward_kwargs: Optional[dict] = None,
                         progress: bool = False) -> Dict[str, torch.Tensor]:
    """Per-channel ``max |x|`` [C] of each named module's input over residue positions."""
    sites = [Site(n, SiteKind.LINEAR, adapter.group_of(n), type(model.get_submodule(n)).__name__, False) for n in names]
    stats = calibrate(model, adapter, sites, {n: _PER_CHANNEL for n in names}, sequences, batch_size=batch_size,
                      forward_kwargs=forward_kwargs, progress=progress)
    out = {}
    for name in names:
        if stats[name].count == 0:
            continue
        lo, hi = stats[name].minmax.compute()
        out[name] = torch.maximum(lo.abs(), hi.abs()).float()
    return out


@torch.no_grad()
def smooth_model_(model: nn.Module, adapter: ModelAdapter, sequences: Sequence[str], spec: SmoothQuantSpec, *,
                  linears: Optional[Collection[str]] = None, batch_size: Optional[int] = None,
                  forward_kwargs: Optional[dict] = None, progress: bool = False) -> Dict[str, torch.Tensor]:
    """Smooth ``model`` in place; returns the factors ``s`` [C] by LayerNorm name (``progress``: of its ranges'
    calibration).

    ``linears``: only pairs with at least one of these Linears (the sites being
    quantized) are smoothed; None smooths every pair.
    """
    pairs = [(ln, lins) for ln, lins in adapter.smoothing_pairs(model)
             if linears is None or any(n in linears for n in lins)]
    if not pairs:
        log.warning("SmoothQuant: %s has no LayerNorm -> Linear pair among the quantized sites; nothing smoothed",
                    type(model).__name__)
        return {}
    absmax = input_channel_absmax(model, adapter, [lins[0] for _, lins in pairs], sequences, batch_size,
                                  forward_kwargs, progress)
    factors = {}
    for ln_name, lin_names in pairs:
        if lin_names[0] not in absmax:
            log.warning("SmoothQuant: %s never saw a residue during calibration; left unsmoothed", lin_names[0])
            continue
        factors[ln_name] = _fold_(model, ln_name, lin_names, absmax[lin_names[0]], spec)
    return factors


def _fold_(model: nn.Module, ln_name: str, lin_names: Sequence[str], act_absmax: torch.Tensor,
           spec: SmoothQuantSpec) -> torch.Tensor:
    norm = model.get_submodule(ln_name)
    weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    if weight is None or bias is None:
        raise ValueError(f"SmoothQuant needs an affine LayerNorm at {ln_name} (weight and bias) to fold into")
    linears = [model.get_submodule(n) for n in lin_names]
    w_absmax = torch.stack([lin.weight.detach().abs().amax(dim=0).float() for lin in linears]).amax(dim=0)
    s = smoothing_factors(act_absmax.to(w_absmax.device), w_absmax, spec.alpha, spec.min_factor)
    weight.div_(s.to(weight))
    bias.div_(s.to(bias))
    for lin in linears:
        lin.weight.mul_(s.to(lin.weight))
    return s
