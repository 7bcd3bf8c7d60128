"""PWLQ sites on the CPU fast path: oneDNN int8 GEMMs for the dense regions, one small float GEMM for the tails.

The GPU kernel's region decomposition (``kernels/pwlq_gemm.py``), rearranged
around a *base* region ``b`` (the widest code interval)::

    y = s_b * (A @ W^T - z_b * colsum) + (o_b + s_b z_b) * colsum
        + sum_{r != b} (s_r - s_b) * (Q_r @ W^T) + (o_r - o_b) * (M_r @ W^T)

``A`` is the code matrix itself, ``z_b = round(-o_b / s_b)`` is oneDNN's
activation zero point (no large offset term cancels against the product), the
residual offset folds into the bias once. ``Q_r`` holds region ``r``'s codes
(else 0), ``M_r`` its indicator. Each other region is then evaluated where it is:

* **tails** (codes in few columns: the outlier channels): every such region's
  correction in ONE float32 GEMM over those columns only, accumulated into the
  output by BLAS (``addmm_``): ``V [M, C] @ (W[:, cols]^T * w_scale)`` with
  ``V = sum_r (s_r - s_b) Q_r + (o_r - o_b) M_r``, both factors formed in float64
  and rounded once (float32 rounding of the tail terms, ~1e-7 relative, like the
  epilogue; the weight columns come from the prepacked copy's dense form). A
  float64 product was exact to 1e-16 but its conversion pass over ``[M, N]`` cost
  more than two int8 GEMMs;
* **dense** regions (the other centre piece; fc2's negative pieces): int8
  GEMMs against the prepacked weight, on the rows that hold the region (all of
  them, usually). When region ``r``'s line meets the base line at an integer
  code ``t`` (``(o_r - o_b) + (s_r - s_b) t == 0``: a continuous codebook),
  ``Q_r`` and ``M_r`` collapse into one operand ``(q - t) [q in r]``: one GEMM
  instead of two. The presets' codebooks are continuous with knots at integer
  codes by construction, but their float32-stored parameters miss the knot by
  rounding: 0 to 4e-7 of the terms that cancel (measured on the 12 x 480 bench
  model; a true kink misses by 1e-4 or more). A miss within ``_KNOT_ROUNDING``
  (2^-20 of those terms) is taken for the knot, and the residual is dropped: each
  value of the region then differs from the exact reference by at most 2^-20 of
  ``|o_r - o_b|``, far inside the fast path's 1e-6 bound. Otherwise both run.

Which regions are tails is decided per call from the columns' code ranges
(``amin``/``amax`` over rows: a superset of the columns holding the region, so
nothing is missed). Operands are built by one compiled pass each
(:func:`~ptq_protein.nn.fused.region_operand`): eager int8 ``where`` cost more
than the GEMM itself.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch

from ptq_protein.nn.cpu_int8 import Packed, gemm, gemm_add_
from ptq_protein.nn.fused import fused_call, region_mask, region_operand

__all__ = ["PwlqRegion", "PwlqPlan", "PwlqOperands", "pwlq_plan", "pwlq_operands", "pwlq_linear"]

# A region whose candidate columns are at most this share of K runs in the tails' column GEMM.
_SPARSE_COLS = 1 / 16
# A dense region on at most this share of the rows runs its int8 GEMMs on those rows only.
_SPARSE_ROWS = 1 / 2


class PwlqRegion(NamedTuple):
    """A non-base region: codes ``[lo, hi]``, coefficients relative to the base, optional integer hinge."""

    lo: int
    hi: int
    dq: float  # s_r - s_b
    dm: float  # o_r - o_b
    hinge: Optional[int]  # t with dm + dq * t == 0 exactly and q - t in int8 on the region, else None
    bounds: torch.Tensor  # int32 [3]: lo, hi, hinge or 0 (the compiled passes' arguments)


class PwlqPlan(NamedTuple):
    """A codebook rearranged around its base region (see the module docstring)."""

    base_scale: float
    base_zero: int  # the base offset as a zero point: o_b = -s_b * z_b + residual (cancellation-free epilogue)
    base_lo: int
    base_hi: int
    base_bias: torch.Tensor  # bias + (o_b + s_b z_b) * w_scale * colsum, float32 [N]
    regions: Tuple[PwlqRegion, ...]


class PwlqOperands(NamedTuple):
    """One call's correction work: int8 GEMM operands (on ``rows`` or all rows) and the float64 tail operand."""

    dense: List[Tuple[float, Optional[torch.Tensor], torch.Tensor]]  # (coefficient, rows or None, int8 operand)
    cols: Optional[torch.Tensor]  # columns of the tail regions' codes
    tails: Optional[torch.Tensor]  # float64 [M, C]: dq * q + dm of the tail region holding each code, else 0


# A knot missed by at most this share of the cancelling terms is the codebook's float32 rounding (see above).
_KNOT_ROUNDING = 2.0 ** -20


def _hinge(lo: int, hi: int, dq: float, dm: float) -> Optional[int]:
    if dq == 0.0:
        return None
    t = round(-dm / dq)
    knot = abs(dm + dq * t) <= _KNOT_ROUNDING * max(abs(dm), abs(dq * t))
    return t if knot and -128 <= lo - t and hi - t <= 127 else None


def pwlq_plan(cb, packed: Packed, bias: Optional[torch.Tensor]) -> PwlqPlan:
    """Base region (widest code interval, then the one holding code 0) and the other regions' coefficients."""
    regions = list(zip(cb.code_lo, cb.code_hi, cb.offset, cb.scale))
    b = max(range(len(regions)), key=lambda r: (regions[r][1] - regions[r][0], regions[r][0] <= 0 <= regions[r][1]))
    lo_b, hi_b, off_b, sc_b = regions[b]
    zero_b = int(min(max(round(-off_b / sc_b), -128), 127))  # s_b * (q - z_b) stays the size of the values
    base_bias = (off_b + sc_b * zero_b) * packed.w_scale.double() * packed.colsum.double()
    if bias is not None:
        base_bias = base_bias + bias.double()
    others = []
    for r, (lo, hi, off, sc) in enumerate(regions):
        if r != b and (sc != sc_b or off != off_b):
            hinge = _hinge(lo, hi, sc - sc_b, off - off_b)
            bounds = torch.tensor([lo, hi, 0 if hinge is None else hinge], dtype=torch.int32)
            others.append(PwlqRegion(lo, hi, sc - sc_b, off - off_b, hinge, bounds))
    return PwlqPlan(sc_b, zero_b, lo_b, hi_b, base_bias.to(torch.float32), tuple(others))


def _dense_operands(codes: torch.Tensor, region: PwlqRegion, rows: Optional[torch.Tensor]):
    sub = codes if rows is None else codes.index_select(0, rows)
    if region.hinge is not None:
        return [(region.dq, rows, fused_call(region_operand, sub, region.bounds))]
    ops = []
    if region.dq != 0.0:
        ops.append((region.dq, rows, fused_call(region_operand, sub, region.bounds)))
    if region.dm != 0.0:
        ops.append((region.dm, rows, fused_call(region_mask, sub, region.bounds)))
    return ops


def _tail_operand(codes: torch.Tensor, tails: List[PwlqRegion], cols: torch.Tensor) -> torch.Tensor:
    """Float64 ``[M, C]``: each code's correction ``dq * q + dm`` when it lies in a tail region, else 0 (one gather)."""
    table = torch.zeros(256, dtype=torch.float64, device=codes.device)  # indexed by code + 128
    for r in tails:
        q = torch.arange(r.lo, r.hi + 1, dtype=torch.float64, device=codes.device)
        table[r.lo + 128:r.hi + 129] = r.dq * q + r.dm
    sub = codes.index_select(1, cols)
    return table[sub.to(torch.int64) + 128]


def pwlq_operands(codes: torch.Tensor, plan: PwlqPlan) -> PwlqOperands:
    """Sort the non-base regions into tails (few columns) and dense ones, and build their operands."""
    m, k = codes.shape
    if m == 0:
        return PwlqOperands([], None, None)
    col_lo, col_hi = codes.amin(dim=0), codes.amax(dim=0)
    row_range = None
    dense, tails, tail_cols = [], [], None
    for r in plan.regions:
        cols = (col_hi >= r.lo) & (col_lo <= r.hi)  # columns that may hold a code of r (a superset)
        n_cols = int(cols.sum())
        if n_cols == 0:
            continue
        if n_cols <= _SPARSE_COLS * k:
            tails.append(r)
            tail_cols = cols if tail_cols is None else tail_cols | cols
            continue
        row_range = row_range or (codes.amin(dim=1), codes.amax(dim=1))
        rows = ((row_range[1] >= r.lo) & (row_range[0] <= r.hi)).nonzero().flatten()
        dense += _dense_operands(codes, r, None if rows.numel() > _SPARSE_ROWS * m else rows)
    if not tails:
        return PwlqOperands(dense, None, None)
    cols = tail_cols.nonzero().flatten()
    return PwlqOperands(dense, cols, _tail_operand(codes, tails, cols))


def pwlq_linear(codes: torch.Tensor, plan: PwlqPlan, packed: Packed) -> torch.Tensor:
    """PWLQ site: the base GEMM (bias folded), the dense regions' int8 GEMMs, the tails' column GEMM."""
    y = gemm(codes, packed, plan.base_scale, plan.base_zero, plan.base_bias)
    ops = pwlq_operands(codes, plan)
    for coef, rows, operand in ops.dense:
        if rows is None:
            gemm_add_(y, operand, packed, coef)
        else:
            y.index_add_(0, rows, gemm(operand, packed, coef))
    if ops.tails is not None:  # y += tails @ (codes[cols] * w_scale): one BLAS call accumulating into y
        weight = packed.weight.to_dense().index_select(0, ops.cols).to(torch.float64).mul_(packed.w_scale.double())
        y.addmm_(ops.tails.to(torch.float32), weight.to(torch.float32))
    return y
