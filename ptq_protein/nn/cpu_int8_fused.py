"""oneDNN int8 GEMMs with their epilogue fused, for an integer encoder layer (:mod:`ptq_protein.nn.layer_int8`).

Each call multiplies unsigned activation codes (``code + 128``, zero point + 128: the same product, see
:func:`ptq_protein.nn.cpu_int8.as_u8`) by a prepacked int8 weight, accumulates exactly in int32 (CPUs where
:func:`ptq_protein.nn.cpu_int8.mode` is ``"native"``), and applies in oneDNN's epilogue what the next
operation needs, so no float32 ``[M, N]`` output is written and read again:

* :func:`linear`: ``x_scale * w_scale[n] * acc + bias[n]`` in float32 or bfloat16 (attention's q, k, v);
* :func:`linear_add_`: the same, added into the residual stream in place (oneDNN's ``sum`` post-op);
* :func:`linear_gelu_codes`: ``GELU`` (erf form) of it, quantized to the next GEMM's unsigned codes.

On CPUs where the native product saturates (``mode() == "split"``, AVX2 without VNNI) each one runs the exact
split GEMM of :func:`ptq_protein.nn.cpu_int8.gemm` and its epilogue in PyTorch instead: the same integers.

:func:`float_rows` multiplies rows the recipe keeps in floating point (BOS/EOS) by the same prepacked int8
weight: each row is written as three int8 planes with their own scales, ``r = a1 q1 + a2 q2 + a3 q3 + e`` with
``|e| <= max|r| / 254**3`` (about float32's own rounding of the row), and each plane is one exact int8 GEMM.
The rows' products then differ from a float32 GEMM with the dequantized weight by float32 rounding only
(tested against float64), and no float copy of the weight is made.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F

from ptq_protein.nn import cpu_int8
from ptq_protein.nn.layer_float_ops import U8_OFFSET, Quant, codes

__all__ = ["linear", "linear_add_", "linear_gelu_codes", "float_rows", "PLANES"]

PLANES = 3  # int8 planes per float row: 3 x 8 bits of a 254-step grid cover float32's 24-bit mantissa


def _split() -> bool:
    return cpu_int8.mode() == "split"


def _signed(codes_u8: torch.Tensor, x_zero_u8: int):
    """The split engine's operands: signed codes and zero point."""
    return torch.bitwise_xor(codes_u8, U8_OFFSET).view(torch.int8), int(x_zero_u8) - U8_OFFSET


def linear(codes_u8: torch.Tensor, packed: cpu_int8.Packed, x_scale: float, x_zero_u8: int,
           bias: Optional[torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``x_scale * w_scale[n] * ((a - x_zero) @ W^T) + bias[n]``, ``[M, N]`` in ``dtype`` (float32 or bfloat16)."""
    if _split():
        codes, x_zero = _signed(codes_u8, x_zero_u8)
        return cpu_int8.gemm(codes, packed, x_scale, x_zero, bias).to(dtype)
    return torch.ops.onednn.qlinear_pointwise(codes_u8, float(x_scale), int(x_zero_u8), packed.weight,
                                              packed.w_scale, packed.w_zero, bias, 1.0, 0, dtype, "none", [], "")


def linear_add_(out: torch.Tensor, codes_u8: torch.Tensor, packed: cpu_int8.Packed, x_scale: float,
                x_zero_u8: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``out += x_scale * w_scale[n] * ((a - x_zero) @ W^T) + bias[n]`` in place; ``out`` float32 ``[M, N]``,
    contiguous."""
    if _split():
        return out.add_(linear(codes_u8, packed, x_scale, x_zero_u8, bias))
    return torch.ops.onednn.qlinear_pointwise.binary(codes_u8, float(x_scale), int(x_zero_u8), packed.weight,
                                                     packed.w_scale, packed.w_zero, out, bias, 1.0, 0, torch.float32,
                                                     1.0, 0, "sum", 1.0, "none", [], "")


def linear_gelu_codes(codes_u8: torch.Tensor, packed: cpu_int8.Packed, x_scale: float, x_zero_u8: int,
                      bias: Optional[torch.Tensor], quant: Quant) -> torch.Tensor:
    """u8 codes of ``GELU(linear(...))`` under ``quant`` (scale, zero point, qmin, qmax).

    oneDNN saturates its unsigned output to ``[0, 255]``; the caller checks that ``quant``'s own range clamps no
    GELU value more (:func:`gelu_codes_fit`).
    """
    scale, zero = float(quant[0]), int(quant[1])
    if _split():
        return codes(F.gelu(linear(codes_u8, packed, x_scale, x_zero_u8, bias)), quant)
    return torch.ops.onednn.qlinear_pointwise(codes_u8, float(x_scale), int(x_zero_u8), packed.weight,
                                              packed.w_scale, packed.w_zero, bias, scale, zero + U8_OFFSET,
                                              torch.uint8, "gelu", [], "none")


GELU_MIN = -0.1700  # GELU's minimum, -0.16997 at x = -0.7518: below it no code is ever reached


def gelu_codes_fit(quant: Quant) -> bool:
    """Whether oneDNN's unsigned output gives ``quant``'s codes for every GELU value: an 8-bit range that ends at
    127 (255 unsigned) and whose low end no GELU value reaches."""
    scale, zero, qmin, qmax = float(quant[0]), int(quant[1]), quant[2], quant[3]
    return qmax == 127 and qmin >= -128 and GELU_MIN / scale + zero > qmin - 0.5


def float_rows(rows: torch.Tensor, packed: cpu_int8.Packed, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``rows @ (W * w_scale)^T + bias`` for float rows ``[R, K]``, float32 ``[R, N]``, from the int8 weight.

    Each row is split into :data:`PLANES` int8 planes (per-row scales, float64 arithmetic: the splitting is
    exact but for the last plane's rounding), the planes run as one exact int8 GEMM, and the planes' products
    are summed in float64.
    """
    r = rows.to(torch.float64)
    planes, scales = [], []
    for _ in range(PLANES):
        scale = r.abs().amax(dim=1, keepdim=True) / 127
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(r / scale).clamp_(-127, 127)
        r = r - q * scale
        planes.append(q)
        scales.append(scale)
    codes = torch.cat(planes).to(torch.int8)
    n = packed.w_scale.shape[0]
    if _split():
        acc = cpu_int8.gemm(codes, packed, w_scale=torch.ones(n))
    else:
        acc = torch.ops.onednn.qlinear_pointwise(torch.bitwise_xor(codes.view(torch.uint8), U8_OFFSET), 1.0,
                                                 U8_OFFSET, packed.weight, torch.ones(n), packed.w_zero, None, 1.0,
                                                 0, torch.float32, "none", [], "")
    acc = acc.to(torch.float64).reshape(PLANES, rows.shape[0], n)
    y = (acc * torch.stack(scales)).sum(0) * packed.w_scale.to(torch.float64)
    return (y if bias is None else y + bias.to(torch.float64)).to(torch.float32)
