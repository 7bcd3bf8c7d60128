"""ESMFold's triangular multiplicative update under bfloat16 autocast, without its float32 detours.

transformers' ``EsmFoldTriangleMultiplicativeUpdate.forward`` multiplies each projection by the float32
padding mask, which widens the bfloat16 products to float32; autocast then narrows them again for the next
Linear and the triangle product, and casts the LayerNorm's float32 output to bfloat16 once for each of its
five Linears. On a CPU that copying is most of the operation's time (the products are small: c_z = 128).

:func:`fused_forward` computes the same values (each gated projection is rounded to bfloat16 once, where
transformers rounds it when the triangle product casts it) with one cast of the normalized pair and no mask
product when nothing is padded. Only a ``bf16-trunk`` uses it (:mod:`.trunk_dtype`); transformers' in-place
inference path (``inplace_safe``) is its own code, unchanged.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ptq_protein.nn.bound_forward import bind_forward

__all__ = ["use_fused_update", "fused_forward"]


def use_fused_update(update: nn.Module) -> None:
    """Run ``update`` (an ``EsmFoldTriangleMultiplicativeUpdate``) through :func:`fused_forward`, in place."""
    bind_forward(update, fused_forward)


def fused_forward(self: nn.Module, z: torch.Tensor, mask: Optional[torch.Tensor] = None,
                  inplace_safe: bool = False, **kwargs) -> torch.Tensor:
    """``EsmFoldTriangleMultiplicativeUpdate.forward``: same inputs, same output (bfloat16 under autocast)."""
    if inplace_safe:
        return type(self).forward(self, z, mask, inplace_safe=inplace_safe, **kwargs)
    low = self.linear_a_p.weight.dtype
    normed = self.layer_norm_in(z).to(low)  # LayerNorm in float32 (autocast's list), cast once
    a = torch.sigmoid(self.linear_a_g(normed)) * self.linear_a_p(normed)
    b = torch.sigmoid(self.linear_b_g(normed)) * self.linear_b_p(normed)
    if mask is not None and not bool(mask.all()):  # padded positions: zero their projections
        keep = mask.unsqueeze(-1).to(low)
        a, b = a * keep, b * keep
    x = self.linear_z(self.layer_norm_out(self._combine_projections(a, b)))
    return x * torch.sigmoid(self.linear_g(normed))
