"""Activation quantization kernels: fp16/bf16/fp32 to int8 codes in one pass over memory.

* :func:`quantize_per_token` - dynamic: one scale (and zero point) per row,
  computed in the kernel from the row's range, then the row is encoded.
* :func:`quantize_per_tensor` - static: given scale and zero point.

Codes are ``clamp(round(x / scale) + zero, qmin, qmax)`` with round half to
even, exactly as :mod:`ptq_protein.kernels.reference` computes them (float32
IEEE division, see :mod:`ptq_protein.kernels._jit_math`), which follows
``ptq_protein.quant.uniform``: NaN encodes like 0, +-Inf clamp. The dynamic
per-token scale needs finite rows.
"""

from __future__ import annotations

from typing import Optional

import torch

from ptq_protein.kernels._jit_math import affine_code, round_half_even_f64
from ptq_protein.kernels._triton import interpreting, jit, tl, triton
from ptq_protein.kernels.checks import check_float_matrix, check_row_param, check_same_device, code_range
from ptq_protein.kernels.dispatch import Backend, resolve_backend
from ptq_protein.kernels.reference import SCALE_FLOOR, quantize_per_tensor_reference, quantize_per_token_reference

__all__ = ["quantize_per_tensor", "quantize_per_token"]

# Elements of one row handled per loop step, and the warps that hold them.
_MAX_BLOCK_K = 4096
_INTERPRETER_MAX_BLOCK_K = 256
_WIDE_BLOCK = 2048  # at or above this, 8 warps instead of 4


@jit
def _row_range(x_row, K, stride_xk, BLOCK_K: tl.constexpr):
    """(min, max, max |x|) of one row, as float32 scalars."""
    offs = tl.arange(0, BLOCK_K)
    lo = tl.zeros((BLOCK_K,), dtype=tl.float32)
    hi = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_row + (k0 + offs) * stride_xk, mask=k0 + offs < K, other=0.0).to(tl.float32)
        lo = tl.minimum(lo, x)
        hi = tl.maximum(hi, x)
    return tl.min(lo, axis=0), tl.max(hi, axis=0), tl.max(tl.maximum(-lo, hi), axis=0)


@jit
def _quantize_per_token_kernel(
    # pointers
    x_ptr, q_ptr, scale_ptr, zero_ptr,
    # sizes
    K,
    # strides
    stride_xm, stride_xk, stride_qm, stride_qk,
    # constexpr
    QMIN: tl.constexpr, QMAX: tl.constexpr, SYMMETRIC: tl.constexpr, FLOOR: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    lo, hi, amax = _row_range(x_row, K, stride_xk, BLOCK_K)  # lo <= 0 <= hi: zero is always representable
    if SYMMETRIC:
        scale = tl.maximum(tl.math.div_rn(amax, QMAX * 1.0), FLOOR)
        zero = tl.full((), 0.0, tl.float32)
    else:  # float64 scalar steps, as ptq_protein.quant.uniform.choose_qparams
        span = hi.to(tl.float64) - lo.to(tl.float64)
        scale = tl.maximum((span / ((QMAX - QMIN) * 1.0)).to(tl.float32), FLOOR)
        zero = QMIN - round_half_even_f64(lo.to(tl.float64) / scale.to(tl.float64))
        zero = tl.minimum(tl.maximum(zero, QMIN * 1.0), QMAX * 1.0).to(tl.float32)
    tl.store(scale_ptr + row, scale)
    tl.store(zero_ptr + row, zero.to(tl.int32))
    offs = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        mask = k0 + offs < K
        x = tl.load(x_row + (k0 + offs) * stride_xk, mask=mask, other=0.0).to(tl.float32)
        tl.store(q_ptr + row * stride_qm + (k0 + offs) * stride_qk, affine_code(x, scale, zero, QMIN, QMAX), mask=mask)


@jit
def _quantize_per_tensor_kernel(
    # pointers (scale float32 and zero int32 hold one value each)
    x_ptr, q_ptr, scale_ptr, zero_ptr,
    # sizes
    K,
    # strides
    stride_xm, stride_xk, stride_qm, stride_qk,
    # constexpr
    QMIN: tl.constexpr, QMAX: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = offs < K
    scale = tl.load(scale_ptr)
    zero = tl.load(zero_ptr)
    x = tl.load(x_ptr + row * stride_xm + offs * stride_xk, mask=mask, other=0.0).to(tl.float32)
    tl.store(q_ptr + row * stride_qm + offs * stride_qk, affine_code(x, scale, zero, QMIN, QMAX), mask=mask)


def quantize_per_token(
    x: torch.Tensor, bits: int = 8, symmetric: bool = True, *, backend: Backend | str = Backend.AUTO
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dynamic per-token (per-row) quantization.

    Parameters
    ----------
    x : fp16, bf16 or fp32 [M, K]
        Any strides (read in place).
    bits : int in [2, 8]
    symmetric : bool
        Symmetric codes in ``[-(2^(b-1)-1), 2^(b-1)-1]`` with zero 0, or
        asymmetric in ``[-2^(b-1), 2^(b-1)-1]`` over the row range widened to
        include 0 (formulas in :func:`~ptq_protein.kernels.reference.quantize_per_token_reference`).

    Returns
    -------
    x_q : int8 [M, K] (contiguous)
    scale : float32 [M]
    zero : int32 [M]
    """
    x = check_float_matrix("x", x)
    qmin, qmax = code_range(bits, symmetric)
    if x.shape[1] == 0:
        raise ValueError("x has K=0 columns; a per-token scale needs at least one value per row")
    if resolve_backend(backend, x.device) is Backend.TORCH:
        return quantize_per_token_reference(x, bits, symmetric)
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8, device=x.device)
    scale = torch.empty(m, dtype=torch.float32, device=x.device)
    zero = torch.empty(m, dtype=torch.int32, device=x.device)
    if m == 0:
        return q, scale, zero
    block, warps = _row_block(k)
    _quantize_per_token_kernel[(m,)](
        x, q, scale, zero,
        k,
        x.stride(0), x.stride(1), q.stride(0), q.stride(1),
        QMIN=qmin, QMAX=qmax, SYMMETRIC=bool(symmetric), FLOOR=SCALE_FLOOR,
        BLOCK_K=block, num_warps=warps,
    )
    return q, scale, zero


def quantize_per_tensor(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero: Optional[torch.Tensor] = None,
    bits: int = 8,
    symmetric: bool = True,
    *,
    backend: Backend | str = Backend.AUTO,
) -> torch.Tensor:
    """Static per-tensor quantization ``clamp(round(x / scale) + zero, qmin, qmax)``.

    Parameters
    ----------
    x : fp16, bf16 or fp32 [M, K]
        Any strides (read in place).
    scale : float32 scalar tensor (0-d or [1]) on x's device
    zero : int32 scalar tensor, or None for 0; must lie in the code range
    bits, symmetric : as in :func:`quantize_per_token` (they set the clamp range)

    Returns
    -------
    int8 [M, K] (contiguous)
    """
    x = check_float_matrix("x", x)
    qmin, qmax = code_range(bits, symmetric)
    if zero is None:
        zero = torch.zeros((), dtype=torch.int32, device=x.device)
    for name, value, dtype in (("scale", scale, torch.float32), ("zero", zero, torch.int32)):
        check_row_param(name, value, 1, dtype)  # 0-d or [1]: one value
    check_same_device(x=x, scale=scale, zero=zero)
    if resolve_backend(backend, x.device) is Backend.TORCH:
        return quantize_per_tensor_reference(x, scale, zero, bits, symmetric)
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8, device=x.device)
    if q.numel() == 0:
        return q
    block, warps = _row_block(k)
    _quantize_per_tensor_kernel[(m, triton.cdiv(k, block))](
        x, q, scale, zero,
        k,
        x.stride(0), x.stride(1), q.stride(0), q.stride(1),
        QMIN=qmin, QMAX=qmax, BLOCK_K=block, num_warps=warps,
    )
    return q


def _row_block(k: int) -> tuple[int, int]:
    """BLOCK_K (power of two covering a row, capped) and num_warps for rows of length k."""
    cap = _INTERPRETER_MAX_BLOCK_K if interpreting() else _MAX_BLOCK_K
    block = min(triton.next_power_of_2(max(k, 1)), cap)
    return block, (8 if block >= _WIDE_BLOCK else 4)
