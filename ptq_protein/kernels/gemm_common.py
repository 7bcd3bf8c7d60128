"""Pieces shared by the three GEMM kernels (W8A8, W4A8, PWLQ): tile order, masked
tile loads, the dequantizing epilogue, and the wrappers' argument preparation.

Epilogue convention (fixed by the quantizers)::

    y[m, n] = x_scale[m] * w_scale[n] * (acc[m, n] - x_zero[m] * colsum[n]) + bias[n]

with ``acc`` the int32 product and ``colsum[n] = sum_k w_q[n, k]``. The zero
point correction is done in int32 (exact), the scales and bias in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ptq_protein.kernels._triton import jit, tl, triton
from ptq_protein.kernels.checks import check_int_matrix, check_out_dtype, check_row_param, check_vector
from ptq_protein.kernels.reference import int8_linear_reference

__all__ = [
    "MAX_K",
    "LinearEpilogue",
    "channel_vectors",
    "check_inner",
    "check_operands",
    "dequant_rows",
    "gemm_grid",
    "gemm_sizes_strides",
    "linear_epilogue",
    "load_int4_tile",
    "load_tile",
    "m_bucket",
    "store_output",
    "tile_coords",
]

# |acc - zero * colsum| <= 2 * 128 * 128 * K must stay below 2^31 (int32 epilogue).
MAX_K = 2**16


@jit
def tile_coords(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id to (tile row, tile column), grouped so GROUP_M row tiles reuse
    the same weight tiles from L2 (the Triton matmul tutorial's ordering)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@jit
def load_tile(ptr, rows, cols, stride_r, stride_c, n_rows, n_cols):
    """Masked load of ``ptr[rows, cols]`` (zeros outside ``[0, n_rows) x [0, n_cols)``)."""
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return tl.load(ptr + rows[:, None] * stride_r + cols[None, :] * stride_c, mask=mask, other=0)


@jit
def dequant_rows(
    acc, offs_m, offs_n, M, N,
    xs_ptr, stride_xs,  # activation scale, stride 0 when per-tensor
    xz_ptr, stride_xz,  # activation zero point (int32), stride 0 when per-tensor
    colsum_ptr,  # int32 [N] row sums of the weight codes
    HAS_ZERO: tl.constexpr,
):
    """``x_scale[m] * (acc - x_zero[m] * colsum[n])`` as float32 (correction in int32)."""
    m_mask = offs_m < M
    if HAS_ZERO:
        zero = tl.load(xz_ptr + offs_m * stride_xz, mask=m_mask, other=0)
        colsum = tl.load(colsum_ptr + offs_n, mask=offs_n < N, other=0)
        acc = acc - zero[:, None] * colsum[None, :]
    x_scale = tl.load(xs_ptr + offs_m * stride_xs, mask=m_mask, other=0.0)
    return acc.to(tl.float32) * x_scale[:, None]


@jit
def store_output(
    val, offs_m, offs_n, M, N,
    ws_ptr,  # float32 [N] per-output-channel weight scale
    bias_ptr,  # [N] bias in any float dtype (unused unless HAS_BIAS)
    y_ptr, stride_ym, stride_yn,
    HAS_BIAS: tl.constexpr,
):
    """``y = val * w_scale[n] + bias[n]`` in float32, rounded once to y's dtype."""
    n_mask = offs_n < N
    w_scale = tl.load(ws_ptr + offs_n, mask=n_mask, other=0.0)
    y = val * w_scale[None, :]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        y = y + bias[None, :]
    mask = (offs_m[:, None] < M) & n_mask[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class LinearEpilogue:
    """Checked epilogue operands of a W8A8 / W4A8 linear, as the kernels read them.

    ``*_stride`` is 0 for a per-tensor activation parameter and 1 for per-token;
    ``colsum`` is present exactly when ``x_zero`` is.
    """

    x_scale: torch.Tensor
    x_scale_stride: int
    x_zero: Optional[torch.Tensor]
    x_zero_stride: int
    w_scale: torch.Tensor
    bias: Optional[torch.Tensor]
    colsum: Optional[torch.Tensor]
    out_dtype: torch.dtype

    def pointers(self) -> tuple[torch.Tensor, ...]:
        """``(xs, xz, ws, colsum, bias)`` for the kernel; absent ones point at ``w_scale`` (never read)."""
        spare = self.w_scale
        return (
            self.x_scale,
            spare if self.x_zero is None else self.x_zero,
            self.w_scale,
            spare if self.colsum is None else self.colsum,
            spare if self.bias is None else self.bias,
        )

    def flags(self) -> dict[str, bool]:
        """The kernels' ``HAS_ZERO`` / ``HAS_BIAS`` constexprs."""
        return {"HAS_ZERO": self.x_zero is not None, "HAS_BIAS": self.bias is not None}

    def reference(self, x_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
        """The exact torch result for int8 weights ``w_q [N, K]`` (backend "torch")."""
        return int8_linear_reference(x_q, self.x_scale, self.x_zero, w_q, self.w_scale, self.bias, self.colsum,
                                     self.out_dtype)

    def empty_output(self, rows: int, n: int, device: torch.device) -> torch.Tensor:
        """The ``[rows, n]`` output buffer the kernel writes."""
        return torch.empty(rows, n, dtype=self.out_dtype, device=device)


def linear_epilogue(
    rows: int,
    n: int,
    x_scale: torch.Tensor,
    x_zero: Optional[torch.Tensor],
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    w_colsum: Optional[torch.Tensor],
    out_dtype: torch.dtype,
    colsum_of_weights: Callable[[], torch.Tensor],
) -> LinearEpilogue:
    """Check the activation and channel parameters of an ``[rows, K] x [n, K]`` linear.

    ``x_scale`` float32 and ``x_zero`` int32 are scalars or ``[rows]``;
    ``w_scale`` float32 ``[n]``; ``bias`` any float ``[n]``; ``w_colsum``
    int32 ``[n]`` (computed with ``colsum_of_weights`` when a zero point needs
    it and none was given). Small vectors are made contiguous.
    """
    w_scale, bias = channel_vectors(n, w_scale, bias, out_dtype)
    xs, xs_stride = check_row_param("x_scale", x_scale, rows, torch.float32)
    xz, xz_stride = (None, 0) if x_zero is None else check_row_param("x_zero", x_zero, rows, torch.int32)
    colsum = None
    if xz is not None:
        colsum = colsum_of_weights() if w_colsum is None else w_colsum
        colsum = check_vector("w_colsum", colsum, n, torch.int32).contiguous()
    return LinearEpilogue(xs, xs_stride, xz, xz_stride, w_scale, bias, colsum, out_dtype)


def channel_vectors(
    n: int, w_scale: torch.Tensor, bias: Optional[torch.Tensor], out_dtype: torch.dtype
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Check ``w_scale`` (float32 ``[n]``), ``bias`` (float ``[n]`` or None) and ``out_dtype``;
    returns the vectors contiguous."""
    check_out_dtype(out_dtype)
    w_scale = check_vector("w_scale", w_scale, n, torch.float32).contiguous()
    if bias is not None:
        bias = check_vector("bias", bias, n, None).contiguous()
    return w_scale, bias


def check_operands(x_name: str, x: torch.Tensor, w_name: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both GEMM operands int8 2-D with the same K (weights ``[N, K]``); returns them."""
    x, w = check_int_matrix(x_name, x), check_int_matrix(w_name, w)
    check_inner(x.shape[1], w.shape[1], x_name, w_name)
    return x, w


def check_inner(k_x: int, k_w: int, x_name: str, w_name: str) -> None:
    """The reduction lengths of activation and weight must agree and fit the int32 epilogue."""
    if k_x != k_w:
        raise ValueError(
            f"{x_name} has K={k_x} columns but {w_name} has K={k_w}; they must match (weights in nn.Linear "
            "layout [N, K])"
        )
    if not 1 <= k_x <= MAX_K:
        raise ValueError(f"K={k_x} must be in [1, {MAX_K}] so the int32 accumulator cannot overflow")


def m_bucket(m: int) -> int:
    """Power-of-two bucket of M: the autotune key, so each new batch size does not re-tune."""
    return triton.next_power_of_2(max(m, 1))


def gemm_sizes_strides(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, k: int) -> tuple[int, ...]:
    """``M, N, K, M_BUCKET`` and the ``a``, ``b``, ``out`` strides, in the GEMM kernels' argument order."""
    m, n = out.shape
    return (m, n, k, m_bucket(m), a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))


def gemm_grid(m: int, n: int) -> Callable[[dict], tuple[int]]:
    """1-D launch grid over output tiles for the chosen BLOCK_M, BLOCK_N."""
    return lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)


@jit
def load_int4_tile(p_ptr, offs_n, k0, stride_pn, stride_pj, N, K, BLOCK_K: tl.constexpr):
    """Weights ``w[offs_n, k0 : k0 + BLOCK_K]`` unpacked to an int8 ``[BLOCK_K, BLOCK_N]`` tile.

    Reads ``BLOCK_K / 2`` bytes per row (``p_ptr`` is the packed matrix viewed
    as int8), splits the nibbles with arithmetic shifts (which sign-extend) and
    interleaves them back into K order. ``k0`` and ``BLOCK_K`` are even.
    """
    offs_j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    packed = load_tile(p_ptr, offs_n, offs_j, stride_pn, stride_pj, N, (K + 1) // 2)  # [BLOCK_N, BLOCK_K / 2]
    low = (packed << 4) >> 4
    high = packed >> 4
    return tl.trans(tl.interleave(low, high))  # w[:, 2j] = low[:, j], w[:, 2j + 1] = high[:, j]
