"""W8A8 GEMM: int8 activations x int8 weights, int32 accumulation, fused epilogue.

``y[m, n] = x_scale[m] * w_scale[n] * (acc[m, n] - x_zero[m] * colsum[n]) + bias[n]``
with ``acc = x_q @ w_q.T`` in int32. One kernel serves :func:`int8_linear`
(epilogue on), :func:`int8_matmul_int32` (raw accumulators, for exactness
checks) and, with ``INT4_WEIGHTS``, the W4A8 :func:`~ptq_protein.kernels.int4_gemm.int4_linear`
(only the weight-tile load differs: packed nibbles unpacked in registers).

Example
-------
>>> x_q, x_scale, _ = quantize_per_token(x)            # x [M, K]
>>> y = int8_linear(x_q, x_scale, None, w_q, w_scale)  # y [M, N]
"""

from __future__ import annotations

from typing import Optional

import torch

from ptq_protein.kernels._triton import ConfigTable, jit, tl, tuned_kernel
from ptq_protein.kernels.checks import check_same_device
from ptq_protein.kernels.dispatch import Backend, resolve_backend
from ptq_protein.kernels.gemm_common import (
    LinearEpilogue,
    check_operands,
    dequant_rows,
    gemm_grid,
    gemm_sizes_strides,
    linear_epilogue,
    load_int4_tile,
    load_tile,
    store_output,
    tile_coords,
)
from ptq_protein.kernels.reference import int_matmul

__all__ = ["int8_linear", "int8_matmul_int32", "launch_gemm"]

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages). Hopper tiles feed
# wgmma (int8 needs K-major operands: both are, in nn.Linear layout); shared
# memory per stage is (BLOCK_M + BLOCK_N) * BLOCK_K bytes (<= 227 KiB on H100/H200,
# <= 163 KiB on A100).
_CONFIGS = ConfigTable(
    names=("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"),
    hopper=(
        (128, 256, 128, 8, 8, 3),
        (256, 128, 128, 8, 8, 3),
        (128, 128, 128, 8, 8, 4),
        (128, 128, 64, 8, 4, 4),
        (64, 128, 128, 8, 4, 4),
        (64, 64, 128, 8, 4, 4),
    ),
    # Triton's sm_80 int8 mma spills beyond 64 accumulator registers per thread
    # (checked with tests/kernels/compile_offline.py), so at most 128x128 per 8 warps.
    ampere=(
        (128, 128, 64, 8, 8, 4),
        (128, 128, 128, 8, 8, 3),
        (64, 128, 64, 8, 4, 4),
        (64, 128, 128, 8, 4, 3),
        (64, 64, 128, 8, 4, 4),
    ),
    interpreter=((16, 32, 32, 2, 4, 1),),
)
_TUNE_KEY = ("M_BUCKET", "N", "K")


@jit
def _int8_gemm_kernel(
    # pointers: operands and output
    a_ptr, b_ptr, y_ptr,
    # pointers: epilogue (read only when EPILOGUE and the flags say so)
    xs_ptr, xz_ptr, ws_ptr, colsum_ptr, bias_ptr,
    # sizes (M_BUCKET only keys the autotuner)
    M, N, K, M_BUCKET,
    # strides, in elements
    stride_am, stride_ak,  # a [M, K]
    stride_bn, stride_bk,  # b [N, K], or packed int4 [N, (K + 1) // 2] (stride per byte)
    stride_ym, stride_yn,  # y [M, N]
    stride_xs, stride_xz,  # 0 for per-tensor activation parameters
    # constexpr
    INT4_WEIGHTS: tl.constexpr,  # b holds packed int4 (see packing.py)
    EPILOGUE: tl.constexpr,  # False: store raw int32 accumulators
    HAS_ZERO: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n = tile_coords(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        a = load_tile(a_ptr, offs_m, k0 + offs_k, stride_am, stride_ak, M, K)  # [BLOCK_M, BLOCK_K]
        if INT4_WEIGHTS:
            b = load_int4_tile(b_ptr, offs_n, k0, stride_bn, stride_bk, N, K, BLOCK_K)  # [BLOCK_K, BLOCK_N]
        else:
            b = load_tile(b_ptr, k0 + offs_k, offs_n, stride_bk, stride_bn, K, N)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(a, b, acc)
    if EPILOGUE:
        val = dequant_rows(acc, offs_m, offs_n, M, N, xs_ptr, stride_xs, xz_ptr, stride_xz, colsum_ptr, HAS_ZERO)
        store_output(val, offs_m, offs_n, M, N, ws_ptr, bias_ptr, y_ptr, stride_ym, stride_yn, HAS_BIAS)
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn, acc, mask=mask)


def int8_linear(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    x_zero: Optional[torch.Tensor],
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    w_colsum: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float32,
    *,
    backend: Backend | str = Backend.AUTO,
) -> torch.Tensor:
    """W8A8 linear with int32 accumulation and a fused dequantizing epilogue.

    Parameters
    ----------
    x_q : int8 [M, K]
        Activation codes; any strides (read in place, never copied).
    x_scale : float32, scalar or [M]
        Per-tensor (static) or per-token activation scale.
    x_zero : int32, scalar or [M], or None
        Activation zero point (a code, within int8); None (or zeros) for symmetric codes.
    w_q : int8 [N, K]
        Symmetric per-output-channel weight codes (nn.Linear layout); any strides.
    w_scale : float32 [N]
    bias : float [N], optional
    w_colsum : int32 [N], optional
        ``w_q.sum(1)``; precompute it once, else it is recomputed each call
        that has a zero point.
    out_dtype : torch.float16, torch.bfloat16 or torch.float32
    backend : "auto", "triton" or "torch"

    Returns
    -------
    torch.Tensor, [M, N] of ``out_dtype``
    """
    x_q, w_q = check_operands("x_q", x_q, "w_q", w_q)
    device = check_same_device(
        x_q=x_q, x_scale=x_scale, x_zero=x_zero, w_q=w_q, w_scale=w_scale, bias=bias, w_colsum=w_colsum
    )
    epi = linear_epilogue(
        x_q.shape[0], w_q.shape[0], x_scale, x_zero, w_scale, bias, w_colsum, out_dtype,
        colsum_of_weights=lambda: w_q.sum(dim=1, dtype=torch.int32),
    )
    if resolve_backend(backend, device) is Backend.TORCH:
        return epi.reference(x_q, w_q)
    return launch_gemm(x_q, w_q, epi.empty_output(x_q.shape[0], w_q.shape[0], device), epi, k=x_q.shape[1])


def int8_matmul_int32(a_q: torch.Tensor, b_q: torch.Tensor, *, backend: Backend | str = Backend.AUTO) -> torch.Tensor:
    """Raw int32 accumulators ``a_q @ b_q.T`` of int8 ``a_q [M, K]`` and ``b_q [N, K]``.

    Returns int32 ``[M, N]``; exact (no rounding anywhere) for K <= 2^16.
    """
    a_q, b_q = check_operands("a_q", a_q, "b_q", b_q)
    device = check_same_device(a_q=a_q, b_q=b_q)
    if resolve_backend(backend, device) is Backend.TORCH:
        return int_matmul(a_q, b_q)
    out = torch.empty(a_q.shape[0], b_q.shape[0], dtype=torch.int32, device=device)
    return launch_gemm(a_q, b_q, out, None, k=a_q.shape[1])


def launch_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    epi: Optional[LinearEpilogue],
    k: int,
    int4_weights: bool = False,
) -> torch.Tensor:
    """Launch the kernel on checked operands into ``out [M, N]``.

    ``b`` is int8 ``[N, K]`` or, with ``int4_weights``, packed int4 viewed as
    int8 ``[N, ceil(K/2)]``; ``epi=None`` stores the raw int32 accumulators.
    """
    if out.numel() == 0:
        return out
    if epi is None:
        pointers, strides, flags = (out,) * 5, (0, 0), {"HAS_ZERO": False, "HAS_BIAS": False}
    else:
        pointers, strides, flags = epi.pointers(), (epi.x_scale_stride, epi.x_zero_stride), epi.flags()
    m, n = out.shape
    kernel = tuned_kernel(_int8_gemm_kernel, _CONFIGS, _TUNE_KEY, out.device)
    kernel[gemm_grid(m, n)](
        a, b, out,
        *pointers,
        *gemm_sizes_strides(a, b, out, k),
        *strides,
        INT4_WEIGHTS=int4_weights,
        EPILOGUE=epi is not None,
        **flags,
    )
    return out
