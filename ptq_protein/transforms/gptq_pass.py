"""Sequential GPTQ over a model: each Linear calibrated on the outputs of the already-quantized layers.

Sites run in forward order (sites reading the very same tensor, such as q/k/v,
share one Hessian). For each group the calibration batches run forward until
the group's first site is reached (:func:`~ptq_protein.calibration.hessian.input_hessian`),
so its Hessian sees the earlier layers' quantized weights, as in the GPTQ
reference. The site's weight is then replaced, in the model being quantized, by
what its codes decode to. Memory holds one ``[K, K]`` Hessian at a time. On a plain
stack of blocks (ESM-2, ESM C) the finished blocks are not rerun
(:mod:`~ptq_protein.calibration.block_replay`): about one forward over the calibration
set plus each block's own reruns; elsewhere (ESMFold) about (number of groups / 2)
forward passes.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional, Sequence

import torch
from torch import nn

from ptq_protein.calibration.hessian import block_replay, input_hessian, linear_call_groups
from ptq_protein.models.adapters import ModelAdapter
from ptq_protein.quant.fit import quantize_weight
from ptq_protein.quant.gptq import gptq_quantize
from ptq_protein.quant.metrics import sqnr_db
from ptq_protein.recipes.config import GPTQSpec, TensorQuant
from ptq_protein.support.progress import progress as progress_of

__all__ = ["gptq_model_"]

log = logging.getLogger(__name__)


@torch.no_grad()
def gptq_model_(model: nn.Module, adapter: ModelAdapter, names: Sequence[str], weights: TensorQuant,
                spec: GPTQSpec, sequences: Sequence[str], *, batch_size: Optional[int] = None,
                forward_kwargs: Optional[dict] = None, replay_blocks: bool = True,
                progress: bool = False, sqnr: Optional[Dict[str, float]] = None) -> Dict[str, Dict[str, torch.Tensor]]:
    """GPTQ the Linears ``names`` of ``model`` in place; returns their codes as ``QuantLinear`` keyword arguments.

    ``model``'s Linear weights become the dequantized GPTQ weights. A site that never
    runs on the calibration set is rounded to nearest (with a warning). ``replay_blocks``: where sound, the
    forwards skip the finished blocks (:mod:`~ptq_protein.calibration.block_replay`; the same values). ``sqnr``,
    when given, receives each site's weight SQNR (dB) against its float weight, measured before it is overwritten:
    no float copy of the model's weights is kept for the report.
    """
    batches = list(adapter.batches(list(sequences), batch_size))
    if not batches:
        raise ValueError("GPTQ needs calibration sequences (got none)")
    model_was_training = model.training
    model.eval()
    try:
        groups = linear_call_groups(model, adapter, names, batches[0], forward_kwargs)
        replay = block_replay(model, adapter, groups, batches[0], forward_kwargs) if replay_blocks else None
        out: Dict[str, Dict[str, torch.Tensor]] = {}
        for g, group in enumerate(progress_of(groups, "GPTQ", "site groups", show=progress)):
            if replay is not None:
                replay.finish_through(replay.plan.group_blocks[g] - 1)  # groups come block by block
            hessian, rows = input_hessian(model, adapter, group[0], batches, forward_kwargs, replay,
                                          special=spec.special_rows)
            for name in group:
                out[name] = _quantize_site_(model.get_submodule(name), name, hessian, weights, spec, sqnr)
            log.debug("GPTQ %s: %d residue rows", ", ".join(group), rows)
    finally:
        model.train(model_was_training)
    missing = [n for n in names if n not in out]
    if missing:
        log.warning("GPTQ: %d Linear site(s) never ran on the calibration set and are rounded to nearest: %s",
                    len(missing), ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))
    return out


def _quantize_site_(linear: nn.Linear, name: str, hessian: Optional[torch.Tensor], weights: TensorQuant,
                    spec: GPTQSpec, sqnr: Optional[Dict[str, float]] = None) -> Dict[str, torch.Tensor]:
    if hessian is None:
        log.warning("GPTQ: %s never saw a residue; its weight is rounded to nearest", name)
        return quantize_weight(linear.weight, weights)
    result = gptq_quantize(linear.weight, hessian, weights.bits, damp=spec.damp, act_order=spec.act_order,
                           block_size=spec.block_size, group_size=spec.group_size)
    rounded = result.dequantize()
    if sqnr is not None:
        sqnr[name] = sqnr_db(linear.weight, rounded)
    linear.weight.copy_(rounded.to(linear.weight))
    return {"weight_codes": result.codes, "weight_scale": result.scale,
            "weight_zero_point": torch.zeros(result.scale.shape, dtype=torch.int32)}
