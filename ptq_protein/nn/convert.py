"""Module swap: replace each selected site's module by its quantized counterpart.

Works on a model the caller handed over for modification (``quantize`` deep-copies
first unless told otherwise). Weights are copied into the new modules.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from ptq_protein.config import QuantConfig, SiteKind
from ptq_protein.errors import InputError
from ptq_protein.nn.modules import ActQuantizer, QuantInput, QuantLinear
from ptq_protein.nn.qparams import quantize_weight
from ptq_protein.calibration.matmul_sites import QuantMatmulHost
from ptq_protein.calibration.sites import Site, set_module

__all__ = ["swap_modules_", "set_module"]


def build_quant_linear(linear: nn.Linear, config: QuantConfig, input_quant: Optional[ActQuantizer],
                       quantize_weights: bool = True, weight_q: Optional[Dict[str, torch.Tensor]] = None) -> QuantLinear:
    """``weight_q``: codes and parameters already chosen (GPTQ) instead of rounding to nearest here."""
    spec = config.weights if quantize_weights else None
    weight = linear.weight.detach()
    kwargs = dict(weight=None, weight_codes=None, weight_scale=None, weight_zero_point=None, weight_codebook=None)
    if spec is None:
        kwargs["weight"] = weight
    else:
        kwargs.update(weight_q if weight_q is not None else quantize_weight(weight, spec))
    return QuantLinear(linear.in_features, linear.out_features, weight_spec=spec,
                       bias=None if linear.bias is None else linear.bias.detach(), input_quant=input_quant,
                       backend=config.backend, **kwargs)


@torch.no_grad()
def swap_modules_(model: nn.Module, sites: Dict[str, Site], input_quants: Dict[str, ActQuantizer],
                  config: QuantConfig, weight_codes: Optional[Dict[str, Dict[str, torch.Tensor]]] = None
                  ) -> Dict[str, str]:
    """Swap modules in place; returns {site name: what was done} for the report.

    ``input_quants`` holds the calibrated (or dynamic) quantizer of each site
    whose input is quantized; a Linear site without one keeps FP inputs.
    ``weight_codes`` holds weight codes chosen by an earlier pass (GPTQ), by site.
    """
    done: Dict[str, str] = {}
    weight_codes = weight_codes or {}
    for name, site in sites.items():
        module = model.get_submodule(name)
        quant = input_quants.get(name)
        device = next(iter(module.parameters()), torch.empty(0)).device
        if quant is not None:
            quant = quant.to(device)
        if site.kind is SiteKind.LINEAR:
            if config.weights is None and quant is None:
                continue
            if config.weights is not None and not torch.isfinite(module.weight).all():
                raise InputError(f"site {name}: its weight holds NaN or Inf values, which cannot be quantized; "
                                 "fix the checkpoint, or exclude the site (QuantConfig exclude=[...])")
            new = build_quant_linear(module, config, quant, weight_q=weight_codes.get(name)).to(device)
            set_module(model, name, new)
            done[name] = "linear" + (" W" if config.weights is not None else "") + (" A" if quant is not None else "")
        elif site.kind in (SiteKind.LAYERNORM, SiteKind.SOFTMAX) and quant is not None:
            set_module(model, name, QuantInput(module, quant))
            done[name] = f"{site.kind.value} input"
        elif site.kind is SiteKind.MATMUL:
            prefix = f"{name}@"
            subs = {k: q.to(device) for k, q in input_quants.items() if k.startswith(prefix)}
            if subs:
                set_module(model, name, QuantMatmulHost(module, name, subs))
                done[name] = "matmul operands"
    return done


