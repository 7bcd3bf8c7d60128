"""PWLQ GEMM: piecewise-affine int8 activation codes x int8 weights in one kernel.

``y[m, n] = w_scale[n] * sum_r (scale_r * (Q_r @ W^T) + offset_r * (M_r @ W^T)) + bias[n]``,
the region-GEMM decomposition of PWLQ (Fang et al. 2020, Sec. 4). The
regions are merged into "slots" by :func:`~ptq_protein.kernels.pwlq_codebook.gemm_plan`
(one integer GEMM per distinct scale and per distinct nonzero |offset|). Each
program computes one output tile for all slots: the code tile is loaded once
per K step, each slot's operand (``q`` masked to its regions, or +-1 region
indicators) is built in registers and fed to ``tl.dot`` with its own int32
accumulator. ``SLOTS_PER_PASS`` (an autotuned constexpr, <= 4) bounds the
accumulators held at once; with more slots the program makes several passes
over K. The region bounds and slot structure are constexpr tuples, so the
masks compile to compares against constants; the slot coefficients are a
float32 vector, combined in float32 in the epilogue.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from ptq_protein.kernels._triton import ConfigTable, jit, tl, tuned_kernel
from ptq_protein.kernels.checks import check_same_device
from ptq_protein.kernels.dispatch import Backend, resolve_backend
from ptq_protein.kernels.gemm_common import (
    channel_vectors,
    check_operands,
    gemm_grid,
    gemm_sizes_strides,
    load_tile,
    store_output,
    tile_coords,
)
from ptq_protein.kernels.pwlq_codebook import Codebook, GemmPlan, Values, check_codebook, device_floats, gemm_plan
from ptq_protein.kernels.reference import pwlq_linear_reference

__all__ = ["pwlq_linear"]

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SLOTS_PER_PASS, num_warps, num_stages):
# one int32 accumulator tile per slot of a pass, so fewer slots per pass allow
# larger tiles. Offline compiles (tests/kernels/compile_offline.py): 1-slot plans
# never spill; 3-slot plans (symmetric PWLQ) spill <= 64 bytes/thread on the
# Hopper rows and not at all on the 64x64 Ampere rows; 9+ slots spill everywhere.
_CONFIGS = ConfigTable(
    names=("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SLOTS_PER_PASS"),
    hopper=(
        (128, 256, 128, 8, 1, 8, 3),
        (128, 128, 128, 8, 1, 8, 3),
        (128, 128, 64, 8, 3, 8, 3),
        (64, 128, 128, 8, 4, 8, 3),
        (64, 64, 128, 8, 4, 4, 3),
    ),
    ampere=(
        (128, 128, 64, 8, 1, 8, 3),
        (64, 128, 64, 8, 3, 8, 3),
        (64, 64, 64, 8, 3, 4, 3),
        (64, 64, 64, 8, 4, 4, 3),
    ),
    interpreter=((16, 32, 32, 2, 3, 4, 1),),
)
_TUNE_KEY = ("M_BUCKET", "N", "K", "NUM_SLOTS")


@jit
def _region_mask(a, MASK: tl.constexpr, CODE_LO: tl.constexpr, CODE_HI: tl.constexpr, NUM_REGIONS: tl.constexpr):
    """``a`` lies in one of the regions whose bit is set in MASK."""
    inside = tl.zeros(a.shape, dtype=tl.int1)
    for r in tl.static_range(NUM_REGIONS):
        if (MASK >> r) & 1:
            inside = inside | ((a >= CODE_LO[r]) & (a <= CODE_HI[r]))
    return inside


@jit
def _slot_dot(
    acc, a, b,
    SLOT: tl.constexpr, LIMIT: tl.constexpr,  # slot index; this pass ends before LIMIT
    KINDS: tl.constexpr, POS: tl.constexpr, NEG: tl.constexpr, NUM_SLOTS: tl.constexpr,
    CODE_LO: tl.constexpr, CODE_HI: tl.constexpr, NUM_REGIONS: tl.constexpr,
):
    """``acc += operand_SLOT(a) @ b`` when SLOT belongs to this pass."""
    if SLOT < LIMIT and SLOT < NUM_SLOTS:
        pos = _region_mask(a, POS[SLOT], CODE_LO, CODE_HI, NUM_REGIONS)
        if KINDS[SLOT] == 1:  # Q-slot: the codes themselves on its regions
            operand = tl.where(pos, a, 0).to(tl.int8)
        else:  # M-slot: +1 / -1 indicators of the regions with offset +o / -o
            neg = _region_mask(a, NEG[SLOT], CODE_LO, CODE_HI, NUM_REGIONS)
            operand = pos.to(tl.int8) - neg.to(tl.int8)
        acc = tl.dot(operand, b, acc)
    return acc


@jit
def _slot_pass(
    a_ptr, b_ptr, offs_m, offs_n, M, N, K,
    stride_am, stride_ak, stride_bn, stride_bk,
    FIRST: tl.constexpr, SLOTS_PER_PASS: tl.constexpr,
    KINDS: tl.constexpr, POS: tl.constexpr, NEG: tl.constexpr, NUM_SLOTS: tl.constexpr,
    CODE_LO: tl.constexpr, CODE_HI: tl.constexpr, NUM_REGIONS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One pass over K for slots FIRST .. FIRST + SLOTS_PER_PASS - 1: their int32 accumulators."""
    end = FIRST + SLOTS_PER_PASS
    offs_k = tl.arange(0, BLOCK_K)
    acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        a = load_tile(a_ptr, offs_m, k0 + offs_k, stride_am, stride_ak, M, K)  # [BLOCK_M, BLOCK_K] codes
        b = load_tile(b_ptr, k0 + offs_k, offs_n, stride_bk, stride_bn, K, N)  # [BLOCK_K, BLOCK_N] weights
        acc0 = _slot_dot(acc0, a, b, FIRST, end, KINDS, POS, NEG, NUM_SLOTS, CODE_LO, CODE_HI, NUM_REGIONS)
        acc1 = _slot_dot(acc1, a, b, FIRST + 1, end, KINDS, POS, NEG, NUM_SLOTS, CODE_LO, CODE_HI, NUM_REGIONS)
        acc2 = _slot_dot(acc2, a, b, FIRST + 2, end, KINDS, POS, NEG, NUM_SLOTS, CODE_LO, CODE_HI, NUM_REGIONS)
        acc3 = _slot_dot(acc3, a, b, FIRST + 3, end, KINDS, POS, NEG, NUM_SLOTS, CODE_LO, CODE_HI, NUM_REGIONS)
    return acc0, acc1, acc2, acc3


@jit
def _fold(acc0, acc1, acc2, acc3, coef_ptr, FIRST: tl.constexpr, SLOTS_PER_PASS: tl.constexpr, NUM_SLOTS: tl.constexpr):
    """``sum_i coeff[FIRST + i] * acc_i`` over the slots of one pass, in float32."""
    out = tl.load(coef_ptr + FIRST) * acc0.to(tl.float32)
    if 1 < SLOTS_PER_PASS and FIRST + 1 < NUM_SLOTS:
        out += tl.load(coef_ptr + FIRST + 1) * acc1.to(tl.float32)
    if 2 < SLOTS_PER_PASS and FIRST + 2 < NUM_SLOTS:
        out += tl.load(coef_ptr + FIRST + 2) * acc2.to(tl.float32)
    if 3 < SLOTS_PER_PASS and FIRST + 3 < NUM_SLOTS:
        out += tl.load(coef_ptr + FIRST + 3) * acc3.to(tl.float32)
    return out


@jit
def _pwlq_gemm_kernel(
    # pointers: codes, weights, output, slot coefficients, epilogue
    a_ptr, b_ptr, y_ptr, coef_ptr, ws_ptr, bias_ptr,
    # sizes (M_BUCKET only keys the autotuner)
    M, N, K, M_BUCKET,
    # strides, in elements
    stride_am, stride_ak,  # a [M, K] codes
    stride_bn, stride_bk,  # b [N, K] weights
    stride_ym, stride_yn,
    # constexpr: codebook regions and slot plan (tuples)
    CODE_LO: tl.constexpr, CODE_HI: tl.constexpr, NUM_REGIONS: tl.constexpr,
    KINDS: tl.constexpr, POS: tl.constexpr, NEG: tl.constexpr, NUM_SLOTS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    # constexpr: tiling
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SLOTS_PER_PASS: tl.constexpr,
):
    pid_m, pid_n = tile_coords(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # The first pass initialises the float32 tile, so it is not live (in registers) during that pass.
    acc0, acc1, acc2, acc3 = _slot_pass(
        a_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bn, stride_bk,
        0, SLOTS_PER_PASS, KINDS, POS, NEG, NUM_SLOTS, CODE_LO, CODE_HI, NUM_REGIONS, BLOCK_M, BLOCK_N, BLOCK_K,
    )
    out = _fold(acc0, acc1, acc2, acc3, coef_ptr, 0, SLOTS_PER_PASS, NUM_SLOTS)
    for first in tl.static_range(SLOTS_PER_PASS, NUM_SLOTS, SLOTS_PER_PASS):
        acc0, acc1, acc2, acc3 = _slot_pass(
            a_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bn, stride_bk,
            first, SLOTS_PER_PASS, KINDS, POS, NEG, NUM_SLOTS, CODE_LO, CODE_HI, NUM_REGIONS, BLOCK_M, BLOCK_N, BLOCK_K,
        )
        out += _fold(acc0, acc1, acc2, acc3, coef_ptr, first, SLOTS_PER_PASS, NUM_SLOTS)
    store_output(out, offs_m, offs_n, M, N, ws_ptr, bias_ptr, y_ptr, stride_ym, stride_yn, HAS_BIAS)


def pwlq_linear(
    x_codes: torch.Tensor,
    offsets: Values,
    scales: Values,
    code_lo: Values,
    code_hi: Values,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float32,
    *,
    check_codes: bool = True,
    backend: Backend | str = Backend.AUTO,
) -> torch.Tensor:
    """Linear layer on PWLQ activation codes (one fused region-GEMM kernel).

    Parameters
    ----------
    x_codes : int8 [M, K]
        Codes from :func:`~ptq_protein.kernels.pwlq_encode.pwlq_quantize`; any strides.
    offsets, scales, code_lo, code_hi : R values each
        The codebook (see :mod:`~ptq_protein.kernels.pwlq_codebook`); Python
        sequences or CPU tensors avoid a device sync.
    w_q : int8 [N, K]
        Symmetric per-output-channel weight codes; any strides.
    w_scale : float32 [N]
    bias : float [N], optional
    out_dtype : torch.float16, torch.bfloat16 or torch.float32
    check_codes : bool
        Raise ValueError when a code lies outside ``[code_lo[0], code_hi[-1]]``
        (costs a min/max pass and a sync; such codes would add nothing).
    backend : "auto", "triton" or "torch"

    Returns
    -------
    torch.Tensor, [M, N] of ``out_dtype``
    """
    x_codes, w_q = check_operands("x_codes", x_codes, "w_q", w_q)
    book = check_codebook(offsets, scales, code_lo, code_hi)
    device = check_same_device(x_codes=x_codes, w_q=w_q, w_scale=w_scale, bias=bias)
    w_scale, bias = channel_vectors(w_q.shape[0], w_scale, bias, out_dtype)
    if check_codes:
        _check_code_range(x_codes, book)
    if resolve_backend(backend, device) is Backend.TORCH:
        return pwlq_linear_reference(
            x_codes, book.offsets, book.scales, book.code_lo, book.code_hi, w_q, w_scale, bias, out_dtype
        )
    out = torch.empty(x_codes.shape[0], w_q.shape[0], dtype=out_dtype, device=device)
    if out.numel() == 0:
        return out
    return _launch(x_codes, w_q, w_scale, bias, out, book, _plan(book))


def _launch(
    a: torch.Tensor, b: torch.Tensor, w_scale: torch.Tensor, bias: Optional[torch.Tensor],
    out: torch.Tensor, book: Codebook, plan: GemmPlan,
) -> torch.Tensor:
    m, n = out.shape
    kernel = tuned_kernel(_pwlq_gemm_kernel, _CONFIGS, _TUNE_KEY, out.device)
    kernel[gemm_grid(m, n)](
        a, b, out, device_floats(plan.coeffs, out.device), w_scale, w_scale if bias is None else bias,
        *gemm_sizes_strides(a, b, out, a.shape[1]),
        CODE_LO=book.code_lo, CODE_HI=book.code_hi, NUM_REGIONS=len(book.scales),
        KINDS=plan.kinds, POS=plan.pos, NEG=plan.neg, NUM_SLOTS=len(plan.kinds),
        HAS_BIAS=bias is not None,
    )
    return out


@functools.lru_cache(maxsize=256)
def _plan(book: Codebook) -> GemmPlan:
    plan = gemm_plan(book)
    assert 1 <= len(plan.kinds) <= 2 * len(book.scales)
    return plan


def _check_code_range(x_codes: torch.Tensor, book: Codebook) -> None:
    if x_codes.numel() == 0:
        return
    lo, hi = int(x_codes.min()), int(x_codes.max())
    if lo < book.code_lo[0] or hi > book.code_hi[-1]:
        raise ValueError(
            f"x_codes hold codes in [{lo}, {hi}] but the codebook covers [{book.code_lo[0]}, {book.code_hi[-1]}]; "
            "encode them with the same codebook (pwlq_quantize) or pass check_codes=False"
        )
