"""Exact int8 accumulators from oneDNN on CPUs whose u8 x s8 GEMM saturates (AVX2 without VNNI).

oneDNN shifts s8 activation codes to u8 (``u = a + 128``) and ``vpmaddubsw`` sums
each pair ``u1 w1 + u2 w2`` into a saturating int16. With ``|w| <= 127`` a pair
stays exact while ``u <= 129``, i.e. for operand codes in ``[-128, 1]``
(``2 * 129 * 127 = 32766``). Every GEMM here keeps its operands in that window:

* **one GEMM** when the codes span at most 130 values: ``a - s`` with
  ``s = max(a) - 1``, the shift returned through oneDNN's bias (``s * colsum``);
* **one GEMM and a column correction** when the codes outside the window that
  holds the most codes (a 256-bin histogram) sit in few columns (ESM's outlier
  channels): the window's GEMM, then the integer tails times those weight
  columns in one float32 BLAS call accumulated into the result;
* **two GEMMs** otherwise: the window under the largest code, and the codes
  below it as ``[-126, -1]`` operands (the second added by oneDNN's "sum"
  post-op; a column correction instead when they sit in few columns).

Every partial sum is an integer held in float32, exact below 2^24 (as the
native path's float epilogue); the scales, zero point and bias are applied by
the caller once, to the whole integer sum. No GEMM is written here.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["SAFE_CODE", "exact_accumulators", "sum_post_op"]

# The largest operand code: oneDNN's shifted u8 operand stays <= 129, 2 * 129 * 127 = 32766 fits int16 pair sums.
SAFE_CODE = 1
_WINDOW = SAFE_CODE + 129  # codes in [-128, SAFE_CODE]
# Tails in at most this share of the columns run as a float32 column GEMM instead of a second int8 GEMM.
_SPARSE_COLS = 1 / 8


def exact_accumulators(a: torch.Tensor, packed, x_zero: int = 0, whole: bool = False) -> Optional[torch.Tensor]:
    """``(a - x_zero) @ W^T`` as float32 ``[M, N]`` (``a`` int8 ``[M, K]``, ``packed`` a ``cpu_int8.Packed``).

    None when one native call is exact as it stands (no code above ``SAFE_CODE``, no zero point) and ``whole``
    is not asked: the caller then keeps oneDNN's fused epilogue. A zero point always comes back in the sum: folded
    into a float bias it would cancel against the product in float32.
    """
    if a.numel() == 0:
        return None
    lo, hi = (int(v) for v in torch.aminmax(a))
    if hi <= SAFE_CODE and x_zero == 0 and not whole:
        return None
    if hi - lo >= _WINDOW:  # the window holding the most codes, if the codes outside it sit in few columns
        acc = _sparse_window(a, packed, x_zero)
        if acc is not None:
            return acc
    # the window under the largest code; when it holds every code (hi - lo < 130) any shift in
    # [hi - SAFE_CODE, lo + 128] does, so one in [0, 126] (int8 operands)
    return _window(a, packed, max(hi - SAFE_CODE, 0), x_zero, dense_tails=True)


def _sparse_window(a: torch.Tensor, packed, x_zero: int) -> Optional[torch.Tensor]:
    """The sum through a window whose tails sit in few columns, or None.

    The site's last such window first (a static site's codes keep their outlier
    channels from batch to batch): the histogram runs only when it no longer fits.
    Any window gives the same exact sum; the choice only moves work between the
    GEMM and the column correction.
    """
    memo = packed.memo
    if "shift" in memo:
        acc = _window(a, packed, memo["shift"], x_zero, dense_tails=False)
        if acc is not None:
            return acc
    memo["shift"] = _busiest_window(a)
    return _window(a, packed, memo["shift"], x_zero, dense_tails=False)


def _busiest_window(a: torch.Tensor) -> int:
    """The shift ``s`` whose window ``[s - 128, s + SAFE_CODE]`` holds the most codes (one 256-bin histogram)."""
    counts = torch.bincount(a.reshape(-1).view(torch.uint8), minlength=256)  # bin b: code b, or b - 256 from 128
    counts = torch.cat([counts.new_zeros(1), torch.cat([counts[128:], counts[:128]]).cumsum(0)])
    held = counts[_WINDOW:] - counts[:-_WINDOW]  # [i]: codes in [i - 128, i - 128 + _WINDOW - 1]
    return int(held.argmax())


def _window(a: torch.Tensor, packed, shift: int, x_zero: int, dense_tails: bool) -> Optional[torch.Tensor]:
    """``a - shift`` clipped to ``[-128, SAFE_CODE]`` in one GEMM, the rest (``tails``) in few columns by BLAS,
    else (``dense_tails``) by a second int8 GEMM: with ``shift = max(a) - SAFE_CODE`` only codes below the window
    remain, as tails in ``[-126, -1]``: safe operands themselves. None when the tails are dense and not allowed.

    ``0 <= shift <= 126``: the operands are formed in int8 (clamp, then a subtraction whose true result fits,
    so its wrap-around arithmetic is exact), two passes instead of six through int16.
    """
    bottom, top = shift - 128, shift + SAFE_CODE
    cols = ((a.amin(dim=0) < bottom) | (a.amax(dim=0) > top)).nonzero().flatten()
    sparse = cols.numel() <= _SPARSE_COLS * a.shape[1]
    if not sparse and not dense_tails:
        return None
    low = a.clamp(max(bottom, -128), min(top, 127)).sub_(shift)
    acc = _unit_gemm(low, packed, shift - x_zero)
    if cols.numel() == 0:
        return acc
    if not sparse:  # top == max(a): the tails lie below the window
        return sum_post_op(acc, a.clamp(max=bottom).sub_(bottom), packed, 1.0, torch.ones_like(packed.w_scale))
    moved = a.index_select(1, cols).to(torch.int16) - shift
    tails = moved - moved.clamp(-128, SAFE_CODE)
    return acc.addmm_(tails.to(torch.float32), _column_codes(packed, cols).to(torch.float32))


def _column_codes(packed, cols: torch.Tensor) -> torch.Tensor:
    """Weight codes ``[C, N]`` (int8) of input columns ``cols``, kept for the next call with the same columns
    (at most ``_SPARSE_COLS`` of the weight) instead of unpacking the whole weight each time."""
    memo = packed.memo
    if "cols" not in memo or not torch.equal(memo["cols"], cols):
        memo["cols"], memo["col_codes"] = cols, packed.weight.to_dense().index_select(0, cols)
    return memo["col_codes"]


def _unit_gemm(a: torch.Tensor, packed, colsum_times: int) -> torch.Tensor:
    """``a @ W^T + colsum_times * colsum`` with unit scales (integers in float32)."""
    bias = None if colsum_times == 0 else packed.colsum * float(colsum_times)
    return torch.ops.onednn.qlinear_pointwise(a, 1.0, 0, packed.weight, torch.ones_like(packed.w_scale),
                                              packed.w_zero, bias, 1.0, 0, torch.float32, "none", [], "")


def sum_post_op(out: torch.Tensor, a: torch.Tensor, packed, scale: float, ws: torch.Tensor,
                x_zero: int = 0) -> torch.Tensor:
    """``out += scale * ws[n] * ((a - x_zero) @ W^T)`` in oneDNN's epilogue (its "sum" post-op: no temporary, no
    extra pass)."""
    return torch.ops.onednn.qlinear_pointwise.binary(a, float(scale), int(x_zero), packed.weight, ws, packed.w_zero,
                                                     out, None, 1.0, 0, torch.float32, 1.0, 0, "sum", 1.0, "none",
                                                     [], "")
