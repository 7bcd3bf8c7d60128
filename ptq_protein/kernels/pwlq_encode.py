"""PWLQ activation encoding: float to one int8 code per element with a piecewise-affine codebook.

Region by value threshold (``thr[r-1] <= x < thr[r]``), then
``q = clamp(round((x - offset[r]) / scale[r]), code_lo[r], code_hi[r])``,
float32, round half to even: bit-identical to
:func:`~ptq_protein.kernels.reference.pwlq_quantize_reference`.
"""

from __future__ import annotations

import torch

from ptq_protein.kernels._jit_math import affine_code
from ptq_protein.kernels._triton import interpreting, jit, tl, triton
from ptq_protein.kernels.checks import check_float_matrix
from ptq_protein.kernels.dispatch import Backend, resolve_backend
from ptq_protein.kernels.pwlq_codebook import Values, check_codebook, check_thresholds, device_floats
from ptq_protein.kernels.reference import pwlq_quantize_reference

__all__ = ["pwlq_quantize"]

_BLOCK_K = 1024
_INTERPRETER_BLOCK_K = 128
_NUM_WARPS = 4


@jit
def _pwlq_quantize_kernel(
    # pointers (float32 codebook vectors of R-1, R, R values)
    x_ptr, q_ptr, thr_ptr, off_ptr, scale_ptr,
    # sizes
    K,
    # strides
    stride_xm, stride_xk, stride_qm, stride_qk,
    # constexpr: region code bounds as tuples of R ints
    CODE_LO: tl.constexpr, CODE_HI: tl.constexpr, NUM_REGIONS: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_xm + offs * stride_xk, mask=mask, other=0.0).to(tl.float32)
    x = tl.where(x != x, 0.0, x)  # NaN encodes like 0 (its region included)
    offset = tl.zeros((BLOCK_K,), dtype=tl.float32) + tl.load(off_ptr)
    scale = tl.zeros((BLOCK_K,), dtype=tl.float32) + tl.load(scale_ptr)
    lo = tl.full((BLOCK_K,), CODE_LO[0], dtype=tl.int32)
    hi = tl.full((BLOCK_K,), CODE_HI[0], dtype=tl.int32)
    for r in tl.static_range(1, NUM_REGIONS):  # thresholds ascend: the last one passed wins
        above = x >= tl.load(thr_ptr + r - 1)
        offset = tl.where(above, tl.load(off_ptr + r), offset)
        scale = tl.where(above, tl.load(scale_ptr + r), scale)
        lo = tl.where(above, CODE_LO[r], lo)
        hi = tl.where(above, CODE_HI[r], hi)
    q = affine_code(x - offset, scale, 0.0, lo, hi)
    tl.store(q_ptr + row * stride_qm + offs * stride_qk, q, mask=mask)


def pwlq_quantize(
    x: torch.Tensor,
    thresholds: Values,
    offsets: Values,
    scales: Values,
    code_lo: Values,
    code_hi: Values,
    *,
    backend: Backend | str = Backend.AUTO,
) -> torch.Tensor:
    """Encode ``x`` with a piecewise-affine (PWLQ) codebook.

    Parameters
    ----------
    x : fp16, bf16 or fp32 [M, K]
        Any strides (read in place).
    thresholds : R-1 floats, ascending
        Value-axis region boundaries; ``x == thr`` goes to the upper region.
        NaN encodes like 0, +-Inf clamp to the end codes.
    offsets, scales : R floats
        Region r decodes ``offset[r] + scale[r] * q`` (scale > 0).
    code_lo, code_hi : R ints
        Contiguous ascending code ranges of the regions, within int8.
        Pass Python sequences or CPU tensors: CUDA tensors cost a device sync.

    Returns
    -------
    int8 [M, K] (contiguous)

    Examples
    --------
    Symmetric 8-bit PWLQ with breakpoint p, range m and 64 centre levels::

        s_c, s_t = p / 64, (m - p) / 63
        o = p - 64 * s_t
        codes = pwlq_quantize(x, [-p - s_c / 2, p + s_c / 2], [-o, 0.0, o], [s_t, s_c, s_t],
                              [-127, -64, 65], [-65, 64, 127])
    """
    x = check_float_matrix("x", x)
    book = check_codebook(offsets, scales, code_lo, code_hi)
    thr = check_thresholds(thresholds, len(book.scales))
    if resolve_backend(backend, x.device) is Backend.TORCH:
        return pwlq_quantize_reference(x, thr, book.offsets, book.scales, book.code_lo, book.code_hi)
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8, device=x.device)
    if q.numel() == 0:
        return q
    block = _INTERPRETER_BLOCK_K if interpreting() else _BLOCK_K
    block = min(block, triton.next_power_of_2(k))
    offs_t = device_floats(book.offsets, x.device)
    _pwlq_quantize_kernel[(m, triton.cdiv(k, block))](
        x, q, device_floats(thr, x.device) if thr else offs_t, offs_t, device_floats(book.scales, x.device),
        k,
        x.stride(0), x.stride(1), q.stride(0), q.stride(1),
        CODE_LO=book.code_lo, CODE_HI=book.code_hi, NUM_REGIONS=len(book.scales),
        BLOCK_K=block, num_warps=_NUM_WARPS,
    )
    return q
