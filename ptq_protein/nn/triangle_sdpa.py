"""ESMFold's triangle attention through ``scaled_dot_product_attention``: the fused kernel, not four passes.

transformers' ``EsmFoldAttention`` writes the attention out: a matrix product to ``[*, H, Q, K]`` logits, the
biases added in place, a softmax, a second product. Under bfloat16 autocast that is four passes over the
largest tensor of a fold, each rounded to bfloat16, with the softmax cast to float32 and back. The triangle
attentions are a third of a fold's time; torch's fused SDPA kernel (flash attention on CPU and CUDA) takes the
summed biases as its ``attn_mask`` and never writes the logits, keeping the softmax's sums in float32.

Only the triangle attentions of a ``bf16-trunk`` use it (:func:`use_sdpa`): the float model keeps
transformers' arithmetic, so its fold stays transformers' own. What it changes: the logits are no longer
rounded to bfloat16 before the softmax (the fused kernel accumulates them in float32), so the result is nearer
the float64 attention than the written-out bfloat16 one (``tests/core/test_triangle_fused.py``).
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ptq_protein.models.esmfold_cfg import FUSED_ATTENTION
from ptq_protein.nn.bound_forward import bind_forward

__all__ = ["use_sdpa", "sdpa_forward"]


def use_sdpa(attention: nn.Module) -> None:
    """Run ``attention`` (an ``EsmFoldAttention``) through :func:`sdpa_forward`, in place; marked with
    ``FUSED_ATTENTION`` (the fold memory model reads it)."""
    bind_forward(attention, sdpa_forward)
    setattr(attention, FUSED_ATTENTION, True)


def sdpa_forward(self: nn.Module, q_x: torch.Tensor, kv_x: torch.Tensor,
                 biases: Optional[List[torch.Tensor]] = None, use_memory_efficient_kernel: bool = False,
                 use_lma: bool = False, use_flash: bool = False, **kwargs) -> torch.Tensor:
    """``EsmFoldAttention.forward`` with the same inputs and output; the attention itself fused.

    ``biases`` broadcast to ``[*, H, Q, K]`` as in transformers; one that is all zeros (the padding mask of
    an unpadded sequence) is skipped, so the triangle bias reaches the kernel as a broadcast view. The other
    kernels transformers offers (memory-efficient, LMA, flash with its own mask) are its own code, unchanged.
    """
    if use_memory_efficient_kernel or use_lma or use_flash:
        return type(self).forward(self, q_x, kv_x, biases, use_memory_efficient_kernel=use_memory_efficient_kernel,
                                  use_lma=use_lma, use_flash=use_flash, **kwargs)
    q_x, kv_x = _held(self, q_x), (q_x if kv_x is q_x else _held(self, kv_x))
    query, key, value = self._prep_qkv(q_x, kv_x)  # [*, H, Q/K, C]; query already divided by sqrt(C)
    mask = _summed_biases(biases or [])
    batch, heads, q_len, width = query.shape[:-3], query.shape[-3], query.shape[-2], query.shape[-1]
    k_len = key.shape[-2]
    if mask is not None:
        mask = mask.to(query.dtype).expand(*batch, heads, q_len, k_len).reshape(-1, heads, q_len, k_len)
    out = F.scaled_dot_product_attention(query.reshape(-1, heads, q_len, width),
                                         key.reshape(-1, heads, k_len, width).to(query.dtype),
                                         value.reshape(-1, heads, k_len, width).to(query.dtype),
                                         attn_mask=mask, scale=1.0)
    out = out.reshape(*batch, heads, q_len, width).transpose(-2, -3)  # [*, Q, H, C]
    return self._wrap_up(out, q_x)


def _held(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` in the dtype the Linear weights are held in: cast once, not by autocast at each of five Linears."""
    dtype = self.linear_q.weight.dtype
    return x if x.dtype == dtype or not x.is_floating_point() else x.to(dtype)


def _summed_biases(biases: List[torch.Tensor]) -> Optional[torch.Tensor]:
    kept = [b for b in biases if bool(b.any())]  # an all-zero padding mask adds nothing
    if not kept:
        return None
    total = kept[0]
    for bias in kept[1:]:
        total = total + bias
    return total
