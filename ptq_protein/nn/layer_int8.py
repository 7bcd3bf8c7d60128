"""One pre-LayerNorm encoder layer (ESM-2's) on integer GEMMs, its float work fused between them.

Module by module, an int8 layer makes about thirty passes over its activations: each LayerNorm, each
quantizer, the GEMM outputs in float32, GELU, the residual adds, rotary and the attention reshapes. This runs
the same layer as::

    codes  = ln_codes(x)                        LayerNorm (and its input quantizer) -> q/k/v codes, one pass
    qkv    = [q k v](codes)                     one GEMM on the stacked weights, float out
    attn   = SDPA(rotary(q), rotary(k), v)      rotary in one pass; attention in the float dtype
    x     += out(codes(attn))                   codes in one pass; the add in oneDNN's epilogue
    codes  = ln_codes(x)
    x     += fc2(gelu_codes(fc1(codes)))        GELU and fc2's codes in fc1's epilogue

with every quantizer's parameters as the recipe has them.
Integer accumulators are exact as on the module path; float epilogues (oneDNN's GELU, the compiled LayerNorm) round
differently in the last bits, so a value on a rounding tie of the next quantizer can take the neighbouring code, as
between the fake and int8 backends. Rows the recipe keeps in float (BOS/EOS) take a float side path through the same
weights (:func:`ptq_protein.nn.cpu_int8_fused.float_rows`).

It runs where every GEMM site is a static per-tensor (``w8a8-uniform``, ``w8a8-smoothquant``, ``w4a8``...) or a
dynamic per-token (``w8a8-dynamic``, ``w8a8-smoothquant-gptq-pertoken``) 8-bit uniform one on the oneDNN path, each
site its own (``w8a8-smoothquant-gptq-lntoken`` mixes the two in one layer), with no hooks on the layer's modules
(:func:`blocker` says why not otherwise). The attention's four Linears may instead all be plain float ones (a
recipe that keeps a layer's attention in float, as ``-lntoken`` does the first layer's): q, k and v then run as one
float GEMM on their stacked weights, the rest as above. A per-token site's codes are each row's
own (:func:`~ptq_protein.quant.uniform.per_token_qparams`, the module path's rule), its GEMM the module path's call
and its epilogue the module path's (:func:`~ptq_protein.nn.cpu_int8.per_token_epilogue_`): from equal inputs, equal
outputs; what the layer saves there is the work between the GEMMs. The architecture code
(``models/fused_float``, ``models/hf_fused``, which name the roles:
:class:`~ptq_protein.models.encoder_roles.EncoderLayer`) falls back to the modules.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import nn
from torch.nn import functional as F

from ptq_protein.models.encoder_roles import EncoderLayer
from ptq_protein.nn import cpu_int8, cpu_int8_fused
from ptq_protein.nn.int_fast import prepack_module
from ptq_protein.nn.int_shared import group_weights
from ptq_protein.nn.layer_float_ops import U8_OFFSET, Quant, codes, layer_norm, rotary, rotary_table
from ptq_protein.quant.uniform import per_token_qparams, qrange
from ptq_protein.recipes.config import Backend, Engine, Granularity, Scheme

__all__ = ["blocker", "forward", "static_quant", "token_quant", "TokenQuant"]


class TokenQuant(NamedTuple):
    """A dynamic per-token uniform activation quantizer: each row's own range, at run time."""

    bits: int
    symmetric: bool


Act = Union[Quant, TokenQuant]  # what one GEMM site's activation codes follow


class Encoded(NamedTuple):
    """One GEMM's unsigned activation codes and what oneDNN and the epilogue need with them."""

    codes: torch.Tensor  # uint8 [M, K]: code + 128
    scale: float  # oneDNN's activation scale (1.0 for per-token rows, scaled in the epilogue)
    zero: int  # its unsigned zero point
    rows: Optional[Tuple[torch.Tensor, torch.Tensor]]  # per-token: each row's scale and zero point [M, 1]


def static_quant(quant: Optional[nn.Module]) -> Optional[Quant]:
    """A static per-tensor uniform activation quantizer's (scale, zero point, qmin, qmax), else None."""
    spec = getattr(quant, "spec", None)
    if spec is None or spec.scheme is not Scheme.UNIFORM or spec.dynamic or quant.scale.numel() != 1:
        return None
    qmin, qmax = qrange(spec.bits, spec.symmetric)
    return quant.scale.reshape(()), quant.zero_point.reshape(()), qmin, qmax


def token_quant(quant: Optional[nn.Module]) -> Optional[TokenQuant]:
    """A dynamic per-token 8-bit uniform activation quantizer's :class:`TokenQuant`, else None."""
    spec = getattr(quant, "spec", None)
    if (spec is None or spec.scheme is not Scheme.UNIFORM or not spec.dynamic or spec.bits != 8
            or spec.granularity is not Granularity.PER_TOKEN):
        return None
    return TokenQuant(spec.bits, spec.symmetric)


def _act(quant: Optional[nn.Module]) -> Optional[Act]:
    """The site's static per-tensor or dynamic per-token parameters, else None."""
    static = static_quant(quant)
    return static if static is not None else token_quant(quant)


def _same(a: Act, b: Act) -> bool:
    """Two sites whose codes of one tensor are equal."""
    if isinstance(a, TokenQuant) or isinstance(b, TokenQuant):
        return a == b
    return all(torch.equal(x, y) for x, y in zip(a[:2], b[:2]))


def blocker(layer: EncoderLayer, x: torch.Tensor) -> Optional[str]:
    """Why ``layer`` cannot run here on ``x`` (None when it can)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return "the fused integer layer runs float32 or bfloat16 CPU tensors"
    if cpu_int8.mode() is None:
        return cpu_int8.reason()
    for m in _int_linears(layer):
        if (getattr(m, "backend", None) is not Backend.INT8 or m.weight_spec is None or m.engine is Engine.REFERENCE
                or m.weight_codebook is not None or not m.symmetric_weight_codes()):
            return f"{type(m).__name__} is not an integer linear with symmetric weight codes on the oneDNN engine"
        quant = _act(m.input_quant)
        if quant is None or (not isinstance(quant, TokenQuant) and (quant[2] < -128 or quant[3] > 127)):
            return ("the fused integer layer takes static per-tensor or dynamic per-token uniform 8-bit "
                    "activations")
    q = _act(layer.q.input_quant) if layer.q in _int_linears(layer) else None
    if q is not None and not (_same(q, _act(layer.k.input_quant)) and _same(q, _act(layer.v.input_quant))):
        return "q, k and v quantize their common input differently"
    for norm in (layer.attn_norm, layer.ffn_norm):
        fake = getattr(norm, "input_quant", None)
        if fake is not None and static_quant(fake) is None:
            return "a LayerNorm input quantizer that is not static per-tensor uniform"
    if _hooked(layer):
        return "hooks on the layer's modules (they would not fire)"
    return None


def _hooked(layer: EncoderLayer) -> bool:
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    parts = (*layer.linears, layer.attn_norm, layer.ffn_norm)
    return any(m._forward_hooks or m._forward_pre_hooks for part in parts for m in part.modules())


def _norm(module: nn.Module) -> Tuple[Optional[Quant], nn.Module]:
    """(the input quantizer's parameters or None, the LayerNorm) of a LayerNorm or QuantInput(LayerNorm)."""
    quant = getattr(module, "input_quant", None)
    return (None if quant is None else static_quant(quant)), getattr(module, "module", module)


def _affine(ln: nn.Module) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A LayerNorm's weight and bias in float32 (a model cast to bfloat16 holds them in bfloat16)."""
    return ln.weight.float(), None if ln.bias is None else ln.bias.float()


def _encode(y: torch.Tensor, act: Act) -> Encoded:
    """``y``'s codes under ``act`` (float32 ``[M, K]``, consumed)."""
    if isinstance(act, TokenQuant):
        scale, zero = per_token_qparams(y, act.bits, act.symmetric)
        return Encoded(codes(y, (scale, zero, *qrange(act.bits, act.symmetric))), 1.0, U8_OFFSET, (scale, zero))
    return Encoded(codes(y, act), *_run(act), None)


def _normed(x: torch.Tensor, module: nn.Module, act: Act) -> Encoded:
    """The codes of ``module``'s LayerNorm of ``x`` (x kept)."""
    fake, ln = _norm(module)
    return _encode(layer_norm(x, fake, *_affine(ln), ln.eps), act)


def _linear(enc: Encoded, packed: cpu_int8.Packed, bias: Optional[torch.Tensor],
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The GEMM of ``enc``'s codes, ``[M, N]`` in ``dtype``: per-token rows scaled after oneDNN's call."""
    if enc.rows is None:
        return cpu_int8_fused.linear(enc.codes, packed, enc.scale, enc.zero, bias, dtype)
    y = cpu_int8_fused.linear(enc.codes, packed, enc.scale, enc.zero, None)  # w_scale[n] * acc (scale 1)
    return cpu_int8.per_token_epilogue_(y, *enc.rows, packed, bias).to(dtype)


def _linear_add_(res: torch.Tensor, enc: Encoded, packed: cpu_int8.Packed, bias: Optional[torch.Tensor]) -> None:
    """``res += linear(...)``: in oneDNN's epilogue for static codes, one more pass for per-token rows."""
    if enc.rows is None:
        cpu_int8_fused.linear_add_(res, enc.codes, packed, enc.scale, enc.zero, bias)
    else:
        res.add_(_linear(enc, packed, bias))


def _norm_rows(rows: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """The LayerNorm of rows kept in float: their input quantizer passes them through."""
    ln = _norm(norm)[1]
    return F.layer_norm(rows, (rows.shape[-1],), *_affine(ln), ln.eps)


def _bias(m: nn.Module) -> Optional[torch.Tensor]:
    return None if m.bias is None else m.bias.to(torch.float32)


def _run(quant: Quant) -> Tuple[float, int]:
    """(scale, unsigned zero point) of a GEMM's input codes."""
    return float(quant[0]), int(quant[1]) + U8_OFFSET


def forward(layer: EncoderLayer, x: torch.Tensor, *, batch_first: bool, cos: torch.Tensor, sin: torch.Tensor,
            attn_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The layer's output for residual stream ``x`` ``[B, T, C]`` (``batch_first``) or ``[T, B, C]``, in that
    layout and dtype; a new tensor (x is the caller's: fair-esm keeps it as a layer's representation).

    ``cos``, ``sin``: ESM's rotary tables, broadcastable to ``[B, T, 1, D]``; ``attn_mask``: SDPA's mask for
    ``[B, H, T, T]`` scores (True: attend), or None. Attention runs in x's dtype (float32, or bfloat16 for a
    model cast to it); the residual stream and the rows kept in float stay float32 inside the layer.
    Inside, rows run batch first.
    """
    dtype = x.dtype
    seq = x if batch_first else x.transpose(0, 1)
    batch, length, channels = seq.shape
    res = seq.reshape(-1, channels)  # contiguous [B*T, C]: a copy where x is time first (fair-esm)
    if res.dtype != torch.float32:
        res = res.to(torch.float32)
    elif res.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        res = res.clone()  # a view of x, which is the caller's
    float_attention = _float_attention(layer)
    keep = (layer.fc1 if float_attention else layer.q).input_quant.special_rows(x)
    index = None
    if keep is not None:
        keep = keep.expand(*x.shape[:-1], 1) if batch_first else keep.expand(*x.shape[:-1], 1).transpose(0, 1)
        index = keep.reshape(-1).nonzero().flatten()
    for m in _int_linears(layer):
        m.engine_ran = Engine.ONEDNN.value

    if float_attention:
        _float_attention_(layer, res, (batch, length), dtype, cos, sin, attn_mask)
        saved = None if index is None else res.index_select(0, index)
    else:
        saved = None if index is None else res.index_select(0, index)
        saved = _int_attention_(layer, res, (batch, length), dtype, cos, sin, attn_mask, index, saved)

    hidden = _act(layer.fc2.input_quant)
    fc1, fc2 = prepack_module(layer.fc1), prepack_module(layer.fc2)
    inner = _normed(res, layer.ffn_norm, _act(layer.fc1.input_quant))
    if inner.rows is None and not isinstance(hidden, TokenQuant) and cpu_int8_fused.gelu_codes_fit(hidden):
        inner = Encoded(cpu_int8_fused.linear_gelu_codes(inner.codes, fc1, inner.scale, inner.zero, _bias(layer.fc1),
                                                         hidden), *_run(hidden), None)
    else:
        inner = _encode(F.gelu(_linear(inner, fc1, _bias(layer.fc1))), hidden)
    _linear_add_(res, inner, fc2, _bias(layer.fc2))
    if index is not None:
        inner = F.gelu(cpu_int8_fused.float_rows(_norm_rows(saved, layer.ffn_norm), fc1, _bias(layer.fc1)))
        res.index_copy_(0, index, saved + cpu_int8_fused.float_rows(inner, fc2, _bias(layer.fc2)))
    res = res.view(batch, length, channels).to(dtype)
    return res if batch_first else res.transpose(0, 1)


def _attend(layer: EncoderLayer, qkv: torch.Tensor, shape: Tuple[int, int], dtype: torch.dtype, cos: torch.Tensor,
            sin: torch.Tensor, attn_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Rotary and attention of ``qkv`` ``[B*T, 3C]`` (q, k, v side by side): float32 ``[B*T, C]``."""
    channels = qkv.shape[-1] // 3
    q, k, v = qkv.view(*shape, 3, layer.heads, channels // layer.heads).unbind(2)
    q = rotary(q, rotary_table(cos, sin, layer.q_scaling), dtype)
    k = rotary(k, rotary_table(cos, sin), dtype)
    att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=attn_mask, scale=1.0).transpose(1, 2)  # [B, T, H, D]
    return att.reshape(-1, channels).to(torch.float32)  # attention writes [B, T, H, D]: a view


def _int_attention_(layer: EncoderLayer, res: torch.Tensor, shape: Tuple[int, int], dtype: torch.dtype,
                    cos: torch.Tensor, sin: torch.Tensor, attn_mask: Optional[torch.Tensor],
                    index: Optional[torch.Tensor], saved: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``res += attention`` on integer q, k, v and out (in place); returns the kept rows (``index``) of the
    updated stream, computed in float from ``saved``, their rows before."""
    group = group_weights((layer.q, layer.k, layer.v))
    qkv = _linear(_normed(res, layer.attn_norm, _act(layer.q.input_quant)), group.packed, group.bias, dtype)
    if index is not None:
        qkv.index_copy_(0, index, cpu_int8_fused.float_rows(_norm_rows(saved, layer.attn_norm), group.packed,
                                                            group.bias).to(dtype))
    att = _attend(layer, qkv, shape, dtype, cos, sin, attn_mask)
    out = prepack_module(layer.out)
    rows = None if index is None else att.index_select(0, index)
    _linear_add_(res, _encode(att, _act(layer.out.input_quant)), out, _bias(layer.out))  # att consumed
    if index is None:
        return None
    saved = saved + cpu_int8_fused.float_rows(rows, out, _bias(layer.out))
    res.index_copy_(0, index, saved)
    return saved


def _float_attention_(layer: EncoderLayer, res: torch.Tensor, shape: Tuple[int, int], dtype: torch.dtype,
                      cos: torch.Tensor, sin: torch.Tensor, attn_mask: Optional[torch.Tensor]) -> None:
    """``res += attention`` where the recipe keeps q, k, v and out in float (in place), in their weights' dtype:
    q, k and v as one GEMM on their stacked weights."""
    fake, ln = _norm(layer.attn_norm)
    proj = (layer.q, layer.k, layer.v)
    weight = torch.cat([m.weight.detach() for m in proj])
    bias = None
    if any(m.bias is not None for m in proj):
        bias = torch.cat([torch.zeros(m.out_features, dtype=weight.dtype) if m.bias is None else m.bias.detach()
                          for m in proj])
    normed = layer_norm(res, fake, *_affine(ln), ln.eps).to(weight.dtype)
    att = _attend(layer, F.linear(normed, weight, bias).to(dtype), shape, dtype, cos, sin, attn_mask)
    out = layer.out
    res.add_(F.linear(att.to(weight.dtype), out.weight.detach(), None if out.bias is None else out.bias.detach()))


def _float_attention(layer: EncoderLayer) -> bool:
    """q, k, v and out are plain float ``nn.Linear`` of one dtype (a recipe keeps the layer's attention in float)."""
    proj = (layer.q, layer.k, layer.v, layer.out)
    return all(type(m) is nn.Linear and m.weight.dtype == layer.q.weight.dtype and m.weight.is_floating_point()
               for m in proj)


def _int_linears(layer: EncoderLayer) -> Tuple[nn.Module, ...]:
    """The layer's Linears the fused layer runs on integer GEMMs: all six, or the FFN's two where the attention's
    four are float (:func:`_float_attention`)."""
    return layer.linears[4:] if _float_attention(layer) else layer.linears
