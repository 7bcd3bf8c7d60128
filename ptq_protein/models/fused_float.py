"""Fused float operations of fair-esm models running integer GEMMs (``backend="int8"``).

Decision 1 of issue 28: around the quantized GEMMs an integer model may run its
float operations in their fastest form. Here, on one CPU thread:

* attention: fair-esm's ``MultiheadAttention`` computes ``softmax(q k^T + mask) v``
  as bmm, masked_fill, softmax and bmm (about a third of an ESM-2 forward). When
  the attention maps are not asked for (``need_head_weights=False``, so no
  ``return_contacts``), it runs as one ``F.scaled_dot_product_attention`` call
  (rotary applied to q and k first, padding keys masked the same way);
* GELU: fair-esm's ``gelu`` is five eager passes (divide, erf, add, two
  multiplies); ``F.gelu`` (the same erf form) is one, about five times faster;
* q, k and v: declared as linears that read one tensor (``shared_input``), so
  the CPU fast path encodes it once and runs one int8 GEMM on the stacked
  weights (``nn/int_shared``; each output column unchanged, bit for bit).

The quantized GEMMs around them are unchanged; these operations are float either
way, so only float32 rounding differs (attention output ~1e-7 relative, tested;
a rounding difference may flip an activation code at a tie downstream).

They run only on integer models (fc1 / the q projection runs ``backend="int8"``, and
the layers such a model's recipe keeps in float: :func:`use_fast_float_if_integer_`):
the fake backend stays the simulation of record, bit for bit. Attention keeps the
explicit path when the weights are requested, in training, with incremental
state, attention masks or bias_k, and while a torch function mode is active (the
interceptor that quantizes attention matmul operands, e.g. ``w8a8-pwlq-all``,
sees each bmm: fused, it would see none). The classes are built on first use
(fair-esm is an optional dependency).

transformers' ESM models need nothing here for attention: transformers 5 runs
them with ``attn_implementation="sdpa"`` by default and returns maps on request.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ptq_protein.models.encoder_roles import EncoderLayer, layer_runner
from ptq_protein.recipes.config import Backend

__all__ = ["use_fused_float_", "use_fast_float_", "use_fast_float_if_integer_", "fused_attention_runs"]


def _base_classes() -> Tuple[type, type]:
    from esm.modules import TransformerLayer
    from esm.multihead_attention import MultiheadAttention

    return MultiheadAttention, TransformerLayer


def use_fused_float_(model: nn.Module, enabled: bool = True) -> int:
    """Give every fair-esm ``MultiheadAttention`` and ``TransformerLayer`` of ``model`` the fused forward (in
    place; same parameters), or with ``enabled=False`` switch it off again (fair-esm's own arithmetic, e.g. to
    compare integer codes with fake).

    Returns how many attention modules have it. A class swap, so ``state_dict``,
    ``deepcopy`` and hooks see the same module; fair-esm's own forward runs whenever fusing may not.
    """
    try:
        bases = _base_classes()
    except ImportError:  # fair-esm not installed: no fair-esm model to patch
        return 0
    count = 0
    for module in model.modules():
        base = next((b for b in bases if isinstance(module, b)), None)
        if base is not None:
            if type(module) is base:
                module.__class__ = _fused_class(base)
            module.fused_float = enabled
            if not enabled and base is bases[0]:
                for proj in (module.q_proj, module.k_proj, module.v_proj):
                    if getattr(proj, "shared_input", None) is not None:
                        proj.shared_input = None  # each projection its own GEMM again
            count += base is bases[0]
    return count


_FUSED: dict = {}


def __getattr__(name: str) -> type:
    """The fused classes by name (``MultiheadAttention``, ``TransformerLayer``), so pickle finds them."""
    try:
        bases = _base_classes()
    except ImportError as err:
        raise AttributeError(name) from err
    for base in bases:
        if base.__name__ == name:
            return _fused_class(base)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fused_class(base: type) -> type:
    """The subclass of a fair-esm class with the fused forward (one per base class)."""
    if base not in _FUSED:
        forward = _forward if base.__name__ == "MultiheadAttention" else _layer_forward
        # the base's class name: site discovery and manifests name modules by it (a MATMUL host)
        _FUSED[base] = type(base.__name__, (base,), {"forward": forward, "fused_float": True,
                                                     "__module__": __name__, "__doc__": forward.__doc__})
    return _FUSED[base]


def _fast(module: nn.Module, linear: nn.Module) -> bool:
    """Integer linears (fake keeps fair-esm's arithmetic, the simulation of record), or a float model a workload
    asked to run fast (:func:`use_fast_float_`)."""
    return getattr(linear, "backend", None) is Backend.INT8 or getattr(module, "fast_float", False)


def use_fast_float_(model: nn.Module) -> int:
    """Run a float fair-esm model's attention as one SDPA call and its GELU in one pass (in place), as integer
    models do: for workloads that only read its outputs (``embed``, ``score``). Calibration and the quantizer's
    reference keep fair-esm's own arithmetic. Returns how many attention modules run fused."""
    count = use_fused_float_(model)
    for module in model.modules():
        if getattr(module, "fused_float", False):
            module.fast_float = True
    return count


def use_fast_float_if_integer_(model: nn.Module) -> int:
    """:func:`use_fast_float_` on a model that runs integer linears (``backend="int8"``), so that the layers a
    recipe keeps in float (``exclude``) run fused as its integer layers do; a fake-backend model keeps
    fair-esm's arithmetic, the simulation of record. Returns how many attention modules run fused (0: none
    touched)."""
    if not any(getattr(m, "backend", None) is Backend.INT8 for m in model.modules()):
        return 0
    return use_fast_float_(model)


def fused_attention_runs(module: nn.Module, need_head_weights: bool = False, **call) -> bool:
    """Whether ``module``'s forward takes the fused path for a call with these arguments (``self_call``:
    key and value are the query tensor itself, as ESM layers call it)."""
    q_proj = getattr(module, "q_proj", None)
    return (getattr(module, "fused_float", False) and not need_head_weights and not module.training
            and _fast(module, q_proj) and call.get("self_call", True)
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
    if self.fused_float:
        _share_input((self.q_proj, self.k_proj, self.v_proj))
    if not fused_attention_runs(self, need_head_weights, **call):
        return super(type(self), self).forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                               static_kv, attn_mask, before_softmax, need_head_weights)
    return self.out_proj(_attention(self, query, key_padding_mask)), None


def _share_input(projections: Tuple[nn.Module, ...]) -> None:
    """Declare that the integer projections read one tensor (``nn/int_shared``: one encoding, one int8 GEMM on
    CPU), as the attribute ``shared_input`` of each: the tuple in output order. Float projections: nothing."""
    if projections[0].__dict__.get("shared_input") != projections and all(
            hasattr(p, "engine_ran") and p.weight_spec is not None for p in projections):  # integer QuantLinears
        for p in projections:
            p.shared_input = projections


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



def _layer_forward(self, x: Tensor, self_attn_mask: Optional[Tensor] = None,
                   self_attn_padding_mask: Optional[Tensor] = None, need_head_weights: bool = False):
    """fair-esm's ``TransformerLayer.forward`` with ``F.gelu`` (one pass) for its five-pass ``gelu`` on integer
    models; fair-esm's own forward otherwise, and when attention maps are asked for (contacts: the maps stay
    fair-esm's own). x ``[T, B, C]``."""
    if need_head_weights or not (self.fused_float and _fast(self, self.fc1)):
        return super(type(self), self).forward(x, self_attn_mask, self_attn_padding_mask, need_head_weights)
    if self_attn_mask is None:
        out = _int8_layer(self, x, self_attn_padding_mask)
        if out is not None:
            return out, None
    residual = x
    x = self.self_attn_layer_norm(x)
    x, attn = self.self_attn(query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask, need_weights=True,
                             need_head_weights=need_head_weights, attn_mask=self_attn_mask)
    x = residual + x
    residual = x
    x = self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
    return residual + x, attn


def _encoder_layer(layer: nn.Module) -> EncoderLayer:
    attn = layer.self_attn
    return EncoderLayer(layer.self_attn_layer_norm, attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj,
                        layer.final_layer_norm, layer.fc1, layer.fc2, attn.num_heads, attn.scaling)


def _int8_layer(layer: nn.Module, x: Tensor, key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
    """fair-esm's layer on the fused integer executor (``nn.layer_int8``; x ``[T, B, C]``), or None where it
    does not run (then the modules run it)."""
    attn = layer.self_attn
    if (layer.training or attn.rot_emb is None or attn.bias_k is not None or attn.add_zero_attn
            or torch._C._is_torch_function_mode_enabled()):
        return None
    roles = _encoder_layer(layer)
    runner = layer_runner(roles)
    if runner is None or runner.blocker(roles, x) is not None:
        return None
    tgt_len, bsz, _ = x.shape
    cos, sin = attn.rot_emb._update_cos_sin_tables(x, seq_dimension=0)  # [1, T, D]
    cos, sin = (t.reshape(1, tgt_len, 1, -1) for t in (cos, sin))
    mask = None
    if key_padding_mask is not None and key_padding_mask.dim() > 0:
        mask = ~key_padding_mask.to(torch.bool).reshape(bsz, 1, 1, tgt_len)  # True: the key takes part
    return runner.forward(roles, x, batch_first=False, cos=cos, sin=sin, attn_mask=mask)
