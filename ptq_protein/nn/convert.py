"""Module swap: replace each selected site's module by its quantized counterpart.

Works on a model the caller handed over for modification (``quantize`` deep-copies
first unless told otherwise). Weights are copied into the new modules.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
from torch import nn

from ptq_protein.calibration.matmul_sites import QuantMatmulHost
from ptq_protein.calibration.sites import Site, set_module
from ptq_protein.nn.modules import ActQuantizer, QuantInput, QuantLinear
from ptq_protein.nn.qparams import quantize_weight
from ptq_protein.quant.metrics import BLOCK_VALUES, sqnr_db_blocks
from ptq_protein.quant.observers import all_finite
from ptq_protein.recipes.config import QuantConfig, SiteKind
from ptq_protein.support.errors import InputError

__all__ = ["swap_modules_", "set_module", "cache_dequantized_weights"]


def build_quant_linear(linear: nn.Linear, config: QuantConfig, input_quant: Optional[ActQuantizer],
                       quantize_weights: bool = True,
                       weight_q: Optional[Dict[str, torch.Tensor]] = None) -> QuantLinear:
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
                  config: QuantConfig, weight_codes: Optional[Dict[str, Dict[str, torch.Tensor]]] = None,
                  weight_sqnr: Optional[Dict[str, float]] = None,
                  after_swap: Optional[Callable[[nn.Module], None]] = None) -> Dict[str, str]:
    """Swap modules in place; returns {site name: what was done} for the report.

    ``input_quants`` holds the calibrated (or dynamic) quantizer of each site
    whose input is quantized; a Linear site without one keeps FP inputs.
    ``weight_codes`` holds weight codes chosen by an earlier pass (GPTQ), by site.
    ``weight_sqnr``, when given, receives each quantized weight's SQNR (dB)
    against its float original, measured as the layer is swapped: the float
    weight is then free to go (nothing else holds it when ``model`` is the
    caller's only copy), so float and int8 layers never all exist at once.
    ``after_swap(old_module)`` runs once each Linear has been replaced (e.g. to
    hand a memory-mapped weight's pages back).
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
            if config.weights is not None and not all_finite(module.weight):
                raise InputError(f"site {name}: its weight holds NaN or Inf values, which cannot be quantized; "
                                 "fix the checkpoint, or exclude the site (QuantConfig exclude=[...])")
            new = build_quant_linear(module, config, quant, weight_q=weight_codes.get(name)).to(device)
            if weight_sqnr is not None and new.weight_spec is not None:
                weight_sqnr[name] = weight_sqnr_db(module.weight.detach(), new)
            set_module(model, name, new)
            if after_swap is not None:
                after_swap(module)
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




def weight_sqnr_db(weight: torch.Tensor, new: QuantLinear) -> float:
    """SQNR (dB) of ``new``'s quantized weight against the float ``weight``, read in blocks of rows.

    The same value as ``sqnr_db(weight, new.dequantized_weight(torch.float32))`` up to
    float64 summation order, without a float32 copy of the whole weight.
    """
    rows = max(1, BLOCK_VALUES // max(1, weight.shape[-1]))
    return sqnr_db_blocks((weight[a:a + rows], new.dequantized_rows(a, a + rows))
                          for a in range(0, weight.shape[0], rows))


def cache_dequantized_weights(model: nn.Module, enabled: bool = True) -> int:
    """Keep (or drop) a float copy of every quantized weight, for repeated fake-backend forwards.

    Costs ``4 x`` the int8 codes' bytes per layer in float32 (the float model's
    size again); saves one elementwise dequantization per layer per forward.
    Returns the number of modules changed.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, QuantLinear) and module.weight_spec is not None:
            module.cache_dequantized = enabled
            module._dequantized = None
            count += 1
    return count
