"""CPU fast path of ``backend="int8"``: oneDNN's int8 GEMM on weights prepacked once.

PyTorch ships oneDNN's quantized linear (``torch.ops.onednn.qlinear_prepack`` /
``qlinear_pointwise``; AVX2, AVX-512 VNNI and AMX kernels chosen by oneDNN at
run time). It multiplies int8 activation codes by the prepacked int8 weight,
accumulates in int32 and applies ``x_scale * w_scale[n] * (acc - x_zero *
colsum[n]) + bias[n]`` in its epilogue, so a static per-tensor site is one call.
No GEMM is written here.

* Static uniform (symmetric or asymmetric): one fused call.
* Dynamic per-token: one call with unit activation scale, then one vectorised
  pass (per-row scale, zero-point correction, bias).
* W4A8: oneDNN has no int4 linear, so 4-bit weight codes (already unpacked to
  int8 in the module) are prepacked as int8: same results, int8 speed and memory.
* PWLQ: the region decomposition of the GPU kernel (``kernels/pwlq_gemm.py``),
  rearranged around a *base* region ``b`` (the widest, which holds almost every
  entry)::

      y = s_b * (A @ W^T - z_b * colsum) + (o_b + s_b z_b) * colsum + sum_{r != b} (s_r - s_b) * (Q_r @ W^T) + (o_r - o_b) * (M_r @ W^T)

  ``A`` is the code matrix itself (no masking pass), ``z_b = round(-o_b / s_b)``
  is oneDNN's activation zero point (so no large offset term cancels against
  the product), the residual offset folds into the bias once, and the other regions' GEMMs run only on the rows
  that hold one of their codes, and not at all when no row does. Regions with
  equal coefficients share one GEMM, as in :func:`~ptq_protein.kernels.pwlq_codebook.gemm_plan`.

Every integer accumulator equals the exact reference's; the float epilogue
(float32 inside oneDNN) agrees with the float64 reference to ~1e-7 relative.
"""

from __future__ import annotations

import functools
import logging
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

__all__ = ["ENGINE_NAME", "Packed", "PwlqPlan", "available", "prepack", "unpack", "gemm", "accumulators",
           "static_linear", "per_token_linear", "pwlq_plan", "pwlq_linear", "pwlq_operands"]

log = logging.getLogger(__name__)

ENGINE_NAME = "onednn"
# A correction GEMM over more than this share of the rows runs on all rows (no gather/scatter).
_DENSE_ROWS = 0.5


class Packed(NamedTuple):
    """One Linear's prepacked int8 weight and its per-output-channel vectors (float32 [N])."""

    weight: torch.Tensor  # opaque oneDNN layout of the [N, K] codes
    w_scale: torch.Tensor
    w_zero: torch.Tensor  # int64 zeros [N]: symmetric weights
    colsum: torch.Tensor  # sum_k W[n, k] (float32, exact below 2^24)
    in_features: int


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """True when oneDNN's int8 linear runs here and reproduces an integer product exactly (checked once)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        gen = torch.Generator().manual_seed(0)
        a = torch.randint(-128, 128, (5, 24), dtype=torch.int8, generator=gen)
        w = torch.randint(-127, 128, (16, 24), dtype=torch.int8, generator=gen)
        acc = accumulators(a, prepack(w, torch.ones(16)))
        return bool(torch.equal(acc, (a.double() @ w.double().t()).to(torch.int32)))
    except (RuntimeError, AttributeError, NotImplementedError) as err:  # op missing or no CPU kernel
        log.info("oneDNN int8 linear unavailable (%s): backend='int8' runs the torch reference on CPU", err)
        return False


def prepack(codes: torch.Tensor, w_scale: torch.Tensor) -> Packed:
    """Prepack int8 weight codes ``[N, K]`` (symmetric, zero point 0) with scales ``[N]`` (or one)."""
    n, k = codes.shape
    codes = codes.to(torch.int8).contiguous()
    weight = torch.ops.onednn.qlinear_prepack(codes, None)
    scale = w_scale.reshape(-1).to(torch.float32).expand(n).contiguous()
    colsum = codes.sum(dim=1, dtype=torch.int32).to(torch.float32)
    return Packed(weight, scale, torch.zeros(n, dtype=torch.int64), colsum, k)


def unpack(packed: Packed) -> torch.Tensor:
    """The plain int8 codes ``[N, K]`` back from the prepacked weight (for saving and the reference)."""
    return packed.weight.to_dense().t().contiguous()


def gemm(a: torch.Tensor, packed: Packed, x_scale: float = 1.0, x_zero: int = 0, bias: Optional[torch.Tensor] = None,
         w_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x_scale * w_scale[n] * (a @ W^T - x_zero * colsum[n]) + bias[n]``, float32 ``[M, N]``; int32 inside."""
    ws = packed.w_scale if w_scale is None else w_scale
    return torch.ops.onednn.qlinear_pointwise(a, float(x_scale), int(x_zero), packed.weight, ws, packed.w_zero,
                                              bias, 1.0, 0, torch.float32, "none", [], "")


def accumulators(a: torch.Tensor, packed: Packed) -> torch.Tensor:
    """The int32 accumulators ``a @ W^T`` as oneDNN computes them (unit scales; exact below 2^24)."""
    n = packed.w_scale.shape[0]
    return gemm(a, packed, w_scale=torch.ones(n)).to(torch.int32)


def static_linear(codes: torch.Tensor, packed: Packed, scale: float, zero: int, bias: Optional[torch.Tensor]):
    """A static per-tensor site: one fused oneDNN call."""
    return gemm(codes, packed, scale, zero, bias)


def per_token_linear(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, packed: Packed,
                     bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Dynamic per-token site: ``scale[m] * (w_scale[n] * acc - zero[m] * w_scale[n] * colsum[n]) + bias``."""
    y = gemm(codes, packed)  # w_scale[n] * acc
    scale = scale.reshape(-1, 1).to(torch.float32)
    if bool((zero != 0).any()):
        y = torch.addcmul(y, zero.reshape(-1, 1).to(torch.float32), (packed.w_scale * packed.colsum)[None, :], value=-1)
    return y.mul_(scale) if bias is None else torch.addcmul(bias.to(torch.float32)[None, :], y, scale)


class PwlqPlan(NamedTuple):
    """A codebook rearranged around its base region (see the module docstring)."""

    base_scale: float
    base_zero: int  # the base offset as a zero point: o_b = -s_b * z_b + residual (cancellation-free epilogue)
    base_lo: int
    base_hi: int
    base_bias: torch.Tensor  # bias + o_b * w_scale * colsum, float32 [N]
    q_slots: Tuple[Tuple[float, Tuple[Tuple[int, int], ...]], ...]  # (s_r - s_b, code intervals)
    m_slots: Tuple[Tuple[float, Tuple[Tuple[int, int], ...]], ...]  # (o_r - o_b, code intervals)


def pwlq_plan(cb, packed: Packed, bias: Optional[torch.Tensor]) -> PwlqPlan:
    """Base region (widest code interval, then the one holding code 0) and merged correction slots."""
    regions = list(zip(cb.code_lo, cb.code_hi, cb.offset, cb.scale))
    b = max(range(len(regions)), key=lambda r: (regions[r][1] - regions[r][0], regions[r][0] <= 0 <= regions[r][1]))
    lo_b, hi_b, off_b, sc_b = regions[b]
    zero_b = int(min(max(round(-off_b / sc_b), -128), 127))  # s_b * (q - z_b) stays the size of the values
    base_bias = (off_b + sc_b * zero_b) * packed.w_scale.double() * packed.colsum.double()
    if bias is not None:
        base_bias = base_bias + bias.double()
    q_slots: Dict[float, List[Tuple[int, int]]] = {}
    m_slots: Dict[float, List[Tuple[int, int]]] = {}
    for r, (lo, hi, off, sc) in enumerate(regions):
        if r == b:
            continue
        for slots, coef in ((q_slots, sc - sc_b), (m_slots, off - off_b)):
            if coef != 0.0:
                slots.setdefault(coef, []).append((lo, hi))
    freeze = lambda d: tuple((c, tuple(iv)) for c, iv in d.items())  # noqa: E731
    return PwlqPlan(sc_b, zero_b, lo_b, hi_b, base_bias.to(torch.float32), freeze(q_slots), freeze(m_slots))


def _inside(codes: torch.Tensor, intervals) -> torch.Tensor:
    mask = None
    for lo, hi in intervals:
        part = (codes >= lo) & (codes <= hi)
        mask = part if mask is None else mask | part
    return mask


def pwlq_operands(codes: torch.Tensor, plan: PwlqPlan):
    """Rows holding a non-base code, and each correction slot's (coefficient, int8 operand on those rows).

    Q-slot operands are the codes on the slot's regions (else 0); M-slot operands
    are 1 on the slot's regions (else 0). Both are exact int8.
    """
    outside = (codes < plan.base_lo) | (codes > plan.base_hi)
    rows = outside.any(dim=1).nonzero().flatten()
    if rows.numel() == 0:
        return rows, []
    dense = rows.numel() > _DENSE_ROWS * codes.shape[0]
    sub = codes if dense else codes.index_select(0, rows)
    zero = torch.zeros((), dtype=torch.int8)
    ops = [(c, torch.where(_inside(sub, iv), sub, zero)) for c, iv in plan.q_slots]
    ops += [(c, _inside(sub, iv).to(torch.int8)) for c, iv in plan.m_slots]
    return (None if dense else rows), ops


def pwlq_linear(codes: torch.Tensor, plan: PwlqPlan, packed: Packed) -> torch.Tensor:
    """PWLQ site: the base GEMM (bias folded) plus correction GEMMs on the rows that need them."""
    y = gemm(codes, packed, plan.base_scale, plan.base_zero, plan.base_bias)
    rows, ops = pwlq_operands(codes, plan)
    for coef, operand in ops:
        part = gemm(operand, packed, abs(coef))
        if rows is None:
            y.add_(part, alpha=1.0 if coef > 0 else -1.0)
        else:
            y.index_add_(0, rows, part, alpha=1.0 if coef > 0 else -1.0)
    return y
