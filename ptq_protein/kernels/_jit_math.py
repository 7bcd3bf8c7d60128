"""Triton device helpers for exact encoding: IEEE division and round half to even.

The interpreter has no libdevice, so ``rint`` is the classic magic-number
rounding: adding ``1.5 * 2^23`` to a float32 of magnitude below ``2^22`` lands
in ``[2^22, 2^24)`` where the spacing is 1, so IEEE round-to-nearest-even does
the rounding; subtracting it back is exact (``1.5 * 2^52`` for float64).
Inputs are clamped first, which never changes a code after the final clamp to
the int8 range. Compiled for sm_80/sm_90 this is two ``add.f32`` (checked in
the PTX) and float32 division is ``div.rn.f32``, so GPU, interpreter and torch
agree bit for bit.
"""

from __future__ import annotations

from ptq_protein.kernels._triton import jit, tl

__all__ = ["affine_code", "round_half_even", "round_half_even_f64"]

_RINT_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23
_RINT_LIMIT = tl.constexpr(4194304.0)  # 2**22: beyond it the float32 trick would round wrongly
_RINT_MAGIC_F64 = tl.constexpr(6755399441055744.0)  # 1.5 * 2**52
_RINT_LIMIT_F64 = tl.constexpr(2251799813685248.0)  # 2**51


@jit
def round_half_even(v):
    """``torch.round`` of float32 ``v`` (clamped to +-2^22; codes are clamped to int8 after)."""
    v = tl.minimum(tl.maximum(v, -_RINT_LIMIT), _RINT_LIMIT)
    return (v + _RINT_MAGIC) - _RINT_MAGIC


@jit
def round_half_even_f64(v):
    """``torch.round`` of float64 ``v`` (clamped to +-2^51)."""
    v = tl.minimum(tl.maximum(v, -_RINT_LIMIT_F64), _RINT_LIMIT_F64)
    return (v + _RINT_MAGIC_F64) - _RINT_MAGIC_F64


@jit
def affine_code(x, scale, zero, lo, hi):
    """``clamp(round(x / scale) + zero, lo, hi)`` as int8, x and scale float32.

    NaN encodes like 0 and +-Inf clamp to the end codes (the convention of
    ``ptq_protein.quant.uniform.quantize``).
    """
    x = tl.where(x != x, 0.0, x)
    q = round_half_even(tl.math.div_rn(x, scale)) + zero
    return tl.minimum(tl.maximum(q, lo), hi).to(tl.int8)
