"""Fused attention for fair-esm models running integer GEMMs (``backend="int8"``).

fair-esm's ``MultiheadAttention`` computes ``softmax(q k^T + mask) v`` as bmm,
masked_fill, softmax and bmm: on one CPU thread about a third of an ESM-2
forward. When the attention maps are not asked for (``need_head_weights=False``,
so no ``return_contacts``), the fused class runs the same
product as one ``F.scaled_dot_product_attention`` call (rotary applied to q and
k first, padding keys masked the same way). The quantized GEMMs around it
(q/k/v/out projections) are unchanged; attention itself is float either way, so
only float32 rounding differs (relative ~1e-6, tested).

It takes the fused path only on integer models (the q projection runs
``backend="int8"``): the fake backend stays the simulation of record, bit for bit.
The fused class keeps the explicit path when the attention weights are requested, in training,
with incremental state, attention masks or bias_k, and while a torch function mode
is active (the interceptor that quantizes attention matmul operands, e.g.
``w8a8-pwlq-all``, sees each bmm: fused, it would see none).

transformers' ESM models need nothing here: transformers 5 runs them with
``attn_implementation="sdpa"`` by default and returns attention maps on request.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ptq_protein.config import Backend

__all__ = ["use_fused_attention_", "fused_attention_runs"]


def _base_class():
    from esm.multihead_attention import MultiheadAttention

    return MultiheadAttention


def use_fused_attention_(model: nn.Module, enabled: bool = True) -> int:
    """Give every fair-esm ``MultiheadAttention`` of ``model`` the fused forward (in place; same parameters),
    or with ``enabled=False`` switch it off again (the explicit path, e.g. to compare integer codes with fake).

    Returns how many modules have it. A class swap, so ``state_dict``, ``deepcopy``
    and hooks see the same module; fair-esm's own forward runs whenever fusing may not.
    """
    try:
        base = _base_class()
    except ImportError:  # fair-esm not installed: no fair-esm model to patch
        return 0
    count = 0
    for module in model.modules():
        if isinstance(module, base):
            if type(module) is base:
                module.__class__ = _fused_class(base)
            module.fused_attention = enabled
            count += 1
    return count


_FUSED: dict = {}


def _fused_class(base: type) -> type:
    """The subclass of fair-esm's ``MultiheadAttention`` with the fused forward (one per base class)."""
    if base not in _FUSED:
        # the base's class name: site discovery and manifests name modules by it (a MATMUL host)
        _FUSED[base] = type(base.__name__, (base,), {"forward": _forward, "fused_attention": True,
                                                     "__module__": __name__, "__doc__": _forward.__doc__})
    return _FUSED[base]


def fused_attention_runs(module: nn.Module, need_head_weights: bool = False, **call) -> bool:
    """Whether ``module``'s forward takes the fused path for a call with these arguments (``self_call``:
    key and value are the query tensor itself, as ESM layers call it)."""
    q_proj = getattr(module, "q_proj", None)
    return (getattr(module, "fused_attention", False) and not need_head_weights and not module.training
            and getattr(q_proj, "backend", None) is Backend.INT8 and call.get("self_call", True)
            and not module.encoder_decoder_attention
            and module.bias_k is None and not module.add_zero_attn
            and all(call.get(k) is None for k in ("incremental_state", "attn_mask"))
            and not call.get("static_kv") and not call.get("before_softmax")
            and not torch._C._is_torch_function_mode_enabled())


def _forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
             key_padding_mask: Optional[Tensor] = None, incremental_state=None, need_weights: bool = True,
             static_kv: bool = False, attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
             need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """fair-esm self-attention as one ``scaled_dot_product_attention`` (no weights returned) where it may
    (:func:`fused_attention_runs`), else fair-esm's own forward. query ``[T, B, C]`` -> ``([T, B, C], None)``."""
    call = {"incremental_state": incremental_state, "attn_mask": attn_mask, "static_kv": static_kv,
            "before_softmax": before_softmax, "self_call": key is query and value is query}
    if not fused_attention_runs(self, need_head_weights, **call):
        return super(type(self), self).forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                               static_kv, attn_mask, before_softmax, need_head_weights)
    return self.out_proj(_attention(self, query, key_padding_mask)), None


def _attention(self, query: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
    """``softmax(q k^T, padding keys masked) v`` for ``query [T, B, C]``, as ``[T, B, C]``."""
    tgt_len, bsz, embed_dim = query.shape
    heads, dim = self.num_heads, self.head_dim
    q = self.q_proj(query) * self.scaling  # fair-esm scales q before rotary
    k, v = self.k_proj(query), self.v_proj(query)
    q, k, v = (t.reshape(tgt_len, bsz * heads, dim).transpose(0, 1) for t in (q, k, v))  # [B*H, T, D]
    if self.rot_emb:
        q, k = self.rot_emb(q, k)
    q, k, v = (t.reshape(bsz, heads, tgt_len, dim) for t in (q, k, v))
    mask = None
    if key_padding_mask is not None and key_padding_mask.dim() > 0:
        mask = ~key_padding_mask.to(torch.bool).reshape(bsz, 1, 1, tgt_len)  # True: the key takes part
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)  # [B, H, T, D]
    return out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)

