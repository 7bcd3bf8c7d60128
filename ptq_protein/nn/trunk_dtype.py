"""ESMFold's folding trunk with its pair operations in bfloat16: the fold's main cost at bfloat16 speed.

:func:`use_trunk_dtype` switches a transformers ``EsmForProteinFolding`` (float or with a quantized
stem) in place. In every trunk block, the pair operations (:data:`PAIR_PARTS`: both triangular
multiplicative updates, both triangle attentions and the pair transition) hold their Linear weights
and biases in bfloat16 (what an artifact stores: 16 bits a value) and run under ``torch.autocast``
where the device computes bfloat16 natively (CUDA; CPUs listing ``avx512_bf16`` or ``amx_bf16``):
Linear layers and matrix products in bfloat16, LayerNorm and softmax in float32 (autocast's own
operator lists), each part's output back in float32 before the block adds it to the pair state; the
triangle attentions' product, bias and softmax as torch's fused kernel (:mod:`.triangle_sdpa`).
Elsewhere (an AVX2-only CPU, where bfloat16 products are emulated and several times slower than
float32) those parts run in float32 on the same bfloat16-valued weights, widened at each call.

The sequence side of each block (sequence attention and transition, the sequence-pair exchanges),
the structure module, the recycling embeddings and the heads are not touched: on a random ESMFold
at the published 48 blocks, the sequence side in bfloat16 moved the fold (TM 0.93 to the FP32 fold,
0.96-0.97 with only its weights rounded) while each pair operation in bfloat16 kept 0.994-0.996.

The Linear modules it holds are marked (:data:`HELD`) so that the artifact's dtype record
(:mod:`ptq_protein.models.float_dtypes`) neither counts nor casts them.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ptq_protein.models import esmfold_cfg, float_dtypes
from ptq_protein.nn.backend_choice import cpu_flags
from ptq_protein.nn.bound_forward import bind_forward
from ptq_protein.nn.triangle_mul_bf16 import use_fused_update
from ptq_protein.nn.triangle_sdpa import use_sdpa

__all__ = ["use_trunk_dtype", "trunk_dtype_of", "native_bf16", "HELD", "PAIR_PARTS"]

log = logging.getLogger(__name__)

HELD = float_dtypes.HELD  # attribute on a module whose floating tensors a pass holds in a dtype of its own
_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs with native bfloat16 dot products
PAIR_PARTS = esmfold_cfg.PAIR_PARTS  # the trunk block's children that read and write the pair state


def use_trunk_dtype(model: nn.Module, dtype: Optional[str] = "bfloat16") -> nn.Module:
    """Hold the pair operations' Linear weights of ``model``'s trunk in ``dtype`` and run them as described above.

    In place; returns ``model``. ``dtype=None`` is refused (a trunk once rounded cannot be restored).
    """
    if dtype != "bfloat16":
        raise ValueError(f"trunk_dtype={dtype!r}: only 'bfloat16' is supported")
    blocks = getattr(getattr(model, "trunk", None), "blocks", None)
    if blocks is None or not hasattr(model, "compute_language_model_representations"):
        raise ValueError(f"trunk_dtype needs an ESMFold model (EsmForProteinFolding), got {type(model).__name__}")
    device = next(model.parameters()).device
    autocast = native_bf16(device)
    for i, block in enumerate(blocks):
        for name in PAIR_PARTS:
            part = getattr(block, name, None)
            if part is None:
                raise ValueError(f"trunk_dtype runs trunk.blocks.{i}.{name} in bfloat16, but the block has no such "
                                 "part: this is not transformers' ESMFold trunk block")
            _hold_linears(part, dtype)
            bind_forward(part, _autocast_forward if autocast else None)
            if autocast:
                _fuse_triangle_operation(part)
    model.trunk_dtype = dtype
    log.info("ESMFold trunk: pair operations' Linear weights held in bfloat16; %s",
             "they run under bfloat16 autocast" if autocast
             else f"they run in float32 ({device.type} has no native bfloat16 products: {_cpu_note(device)})")
    return model


def _fuse_triangle_operation(part: nn.Module) -> None:
    """Triangle attention as one fused kernel (:mod:`.triangle_sdpa`); the multiplicative update cast once
    (:mod:`.triangle_mul_bf16`)."""
    if type(part).__name__ == "EsmFoldTriangleAttention":
        use_sdpa(part.mha)
    elif type(part).__name__ == "EsmFoldTriangleMultiplicativeUpdate":
        use_fused_update(part)


def _hold_linears(part: nn.Module, dtype: str) -> None:
    for module in part.modules():
        if type(module) is nn.Linear or type(module).__name__ == "EsmFoldLinear":  # float Linears only
            module.to(torch.bfloat16)
            setattr(module, HELD, dtype)
            bind_forward(module, _held_linear_forward)


def trunk_dtype_of(model: nn.Module) -> Optional[str]:
    """The trunk dtype ``model`` runs with (None: the model's own)."""
    return getattr(model, "trunk_dtype", None)


def native_bf16(device: torch.device) -> bool:
    """True where bfloat16 products run natively: CUDA, or a CPU listing avx512_bf16 / amx_bf16."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and bool(set(_BF16_FLAGS) & cpu_flags())


def _held_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if _autocast_on(x.device.type) or x.dtype == self.weight.dtype:
        return F.linear(x, self.weight, self.bias)
    bias = None if self.bias is None else self.bias.to(x.dtype)
    return F.linear(x, self.weight.to(x.dtype), bias)


def _autocast_forward(self: nn.Module, *args, **kwargs) -> torch.Tensor:
    with torch.autocast(args[0].device.type, dtype=torch.bfloat16):
        out = type(self).forward(self, *args, **kwargs)
    return out.float()


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4: one query per device type
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def _cpu_note(device: torch.device) -> str:
    return "no avx512_bf16 or amx_bf16 flag" if device.type == "cpu" else "not CUDA"
