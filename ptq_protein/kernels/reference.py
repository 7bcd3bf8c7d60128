"""Exact torch references of every kernel: integer math exact, epilogues in float64.

These are what the wrappers run when Triton cannot (``backend="torch"``) and
what the tests compare the kernels against. They assume inputs the wrappers
have already checked. Integer products are exact: ``torch._int_mm`` where its
CUDA shape limits allow, otherwise a float64 matmul, which is exact because
every partial sum of int8 products stays below ``2^14 * K < 2^53``.

Rounding is ``torch.round`` (half to even) everywhere; divisions are IEEE
divisions by tensors (codes: float32 ``x / scale``), so the Triton kernels,
which use ``div_rn``, produce the same codes bit for bit. The quantization
rules are those of ``ptq_protein.quant.uniform`` and ``ptq_protein.quant.codebook``
(NaN encodes like 0, +-Inf clamp to the end codes).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ptq_protein.kernels.checks import code_range

__all__ = [
    "SCALE_FLOOR",
    "int8_linear_reference",
    "int_matmul",
    "pwlq_linear_reference",
    "pwlq_quantize_reference",
    "quantize_per_tensor_reference",
    "quantize_per_token_reference",
]

# Smallest scale: the smallest normal float32, as ptq_protein.quant.uniform.SCALE_FLOOR,
# so an all-zero row gets a finite, non-denormal scale.
SCALE_FLOOR = float(torch.finfo(torch.float32).tiny)
# torch._int_mm on CUDA (aten/src/ATen/native/cuda/Blas.cpp): M > 16, K and N multiples of 8.
_INT_MM_MIN_M = 17
_INT_MM_MULTIPLE = 8


def int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact ``a @ b.T`` of int8 matrices ``a [M, K]``, ``b [N, K]`` as int32 ``[M, N]``."""
    m, k = a.shape
    n = b.shape[0]
    if a.is_cuda and m >= _INT_MM_MIN_M and k % _INT_MM_MULTIPLE == 0 and n % _INT_MM_MULTIPLE == 0:
        return torch._int_mm(a.contiguous(), b.contiguous().t())
    return (a.double() @ b.double().t()).to(torch.int32)


def int8_linear_reference(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    x_zero: Optional[torch.Tensor],
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    w_colsum: Optional[torch.Tensor],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``x_scale[m] * w_scale[n] * (acc - x_zero[m] * colsum[n]) + bias[n]`` in float64."""
    acc = int_matmul(x_q, w_q).double()
    if x_zero is not None:
        colsum = w_q.sum(dim=1, dtype=torch.int64) if w_colsum is None else w_colsum
        acc = acc - _per_row(x_zero, x_q.shape[0]) * colsum.double()[None, :]
    return _finish(acc * _per_row(x_scale, x_q.shape[0]), w_scale, bias, out_dtype)


def quantize_per_token_reference(
    x: torch.Tensor, bits: int, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dynamic per-row quantization of finite ``x [M, K]``: codes, scale ``[M]``, zero ``[M]``.

    The rule of ``ptq_protein.quant.uniform.dynamic_per_token``: the row range
    ``[lo, hi]`` widened to include 0; symmetric ``scale = max(|lo|, hi) / qmax``
    and zero 0; asymmetric ``scale = (hi - lo) / (qmax - qmin)`` (float64, then
    float32) and ``zero = clamp(qmin - round(lo / scale), qmin, qmax)`` (float64);
    scales floored at :data:`SCALE_FLOOR`.
    """
    qmin, qmax = code_range(bits, symmetric)
    xf = x.float()
    lo = torch.clamp(xf.amin(dim=1), max=0.0).double()
    hi = torch.clamp(xf.amax(dim=1), min=0.0).double()
    if symmetric:
        scale = (torch.maximum(-lo, hi) / qmax).float().clamp(min=SCALE_FLOOR)
        zero = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)
    else:
        scale = ((hi - lo) / (qmax - qmin)).float().clamp(min=SCALE_FLOOR)
        zero = torch.clamp(qmin - torch.round(lo / scale.double()), qmin, qmax).to(torch.int32)
    return _encode(xf, scale[:, None], zero[:, None], qmin, qmax), scale, zero


def quantize_per_tensor_reference(
    x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int, symmetric: bool
) -> torch.Tensor:
    """``clamp(round(x / scale) + zero, qmin, qmax)`` with one scale and zero."""
    qmin, qmax = code_range(bits, symmetric)
    return _encode(x.float(), scale.reshape(()), zero.reshape(()), qmin, qmax)


def pwlq_quantize_reference(
    x: torch.Tensor,
    thresholds: Sequence[float],
    offsets: Sequence[float],
    scales: Sequence[float],
    code_lo: Sequence[int],
    code_hi: Sequence[int],
) -> torch.Tensor:
    """Piecewise-affine encoding: region by value threshold, then affine code, clamped to the region."""
    xf = torch.nan_to_num(x.float(), nan=0.0)
    dev = x.device
    region = torch.bucketize(xf, torch.tensor(thresholds, dtype=torch.float32, device=dev), right=True)
    offset = torch.tensor(offsets, dtype=torch.float32, device=dev)[region]
    scale = torch.tensor(scales, dtype=torch.float32, device=dev)[region]
    lo = torch.tensor(code_lo, dtype=torch.float32, device=dev)[region]
    hi = torch.tensor(code_hi, dtype=torch.float32, device=dev)[region]
    q = torch.round((xf - offset) / scale)
    return torch.minimum(torch.maximum(q, lo), hi).to(torch.int8)


def pwlq_linear_reference(
    x_codes: torch.Tensor,
    offsets: Sequence[float],
    scales: Sequence[float],
    code_lo: Sequence[int],
    code_hi: Sequence[int],
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``w_scale[n] * sum_r (scale_r * Q_r @ W^T + offset_r * M_r @ W^T) + bias`` (PWLQ Sec. 4).

    ``Q_r = x * [x in r]`` and ``M_r = [x in r]`` per region, int32 matmuls,
    combined in float64.
    """
    total = torch.zeros(x_codes.shape[0], w_q.shape[0], dtype=torch.float64, device=x_codes.device)
    zero = torch.zeros((), dtype=torch.int8, device=x_codes.device)
    for offset, scale, lo, hi in zip(offsets, scales, code_lo, code_hi):
        inside = (x_codes >= lo) & (x_codes <= hi)
        total += scale * int_matmul(torch.where(inside, x_codes, zero), w_q).double()
        if offset != 0.0:
            total += offset * int_matmul(inside.to(torch.int8), w_q).double()
    return _finish(total, w_scale, bias, out_dtype)


def _per_row(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-tensor or per-row parameter as a float64 column ``[rows, 1]``."""
    return t.double().reshape(-1, 1).expand(rows, 1)


def _finish(total: torch.Tensor, w_scale: torch.Tensor, bias: Optional[torch.Tensor], out_dtype: torch.dtype):
    """Per-output-channel scale and bias in float64, then one rounding to ``out_dtype``."""
    y = total * w_scale.double()[None, :]
    if bias is not None:
        y = y + bias.double()[None, :]
    return y.to(out_dtype)


def _encode(xf: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """``clamp(round(x / scale) + zero, qmin, qmax)`` as int8 (round half to even, NaN like 0)."""
    return torch.clamp(torch.round(torch.nan_to_num(xf, nan=0.0) / scale) + zero, qmin, qmax).to(torch.int8)
