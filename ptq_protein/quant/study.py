"""The PTQ4Protein study's quantizers, reproduced operation for operation.

"Exploring Post-Training Quantization of Protein Language Models" published its
quantizers as the ``piecewise_quant`` package (github.com/pengshuang/PTQ4Protein,
commit 605deb2). These functions do the same float operations in the same order,
so their outputs equal that package's bit for bit (``tests/quant/test_study_parity.py``
checks this against a re-implementation written in the test). Citations are
``file:line`` in that tree. Exact to the *published* package: the notebooks that
printed the study's numbers import ``linear_quant``, which was not published
(see :mod:`ptq_protein.recipes.study`).

What the study's quantizers are (not what their names suggest):

* **uniform** (``uniform.py:5-48``): per tensor, symmetric over ``M = max(-min, max)``
  with ``scale = 2M / (2^b - 1)`` and codes ``[-2^(b-1), 2^(b-1) - 1]`` (so ``+M`` maps
  to ``127/127.5 M`` at 8 bits), or, when the calibrated minimum is >= 0, unsigned
  over ``[0, M]`` with ``scale = M / (2^b - 1)`` and codes ``[0, 2^b - 1]``. Rounding
  is half to even (``torch.round``).
* **pwlq-3** (``piecewise.py:6-29,58-65``): the range M is static (calibrated); the
  breakpoint ``p`` is recomputed on *every call* from that tensor's std and max|x|
  by bisection on the Gaussian optimality condition of the *non-overlapping*
  scheme (``piecewise.py:71-131``). Values with ``|x| < p`` take a b-bit grid over
  ``[-p, p]``, the others a b-bit grid over the *whole* ``[-M, M]`` (always signed).
  Two full b-bit grids plus the region flag: **b+1 bits per value**.
* **W8** (``quant_weis.py:8-51``): per output row for tensors of >= 2 dims, per
  tensor for 1-dim ones, each with the uniform rule above over its own max|w|.
"""

from __future__ import annotations

from typing import Tuple, Union

import numpy as np
import torch

__all__ = ["study_signed_range", "study_uniform", "study_breakpoint", "study_pwlq", "study_weight",
           "study_weight_rows", "study_topk_reduce", "BISECTION_TOL", "BISECTION_MAX_ITER", "STD_EPS"]

BISECTION_TOL = 1e-3  # piecewise.py:112 binary_search(tol=1e-3)
BISECTION_MAX_ITER = 100  # piecewise.py:112 binary_search(max_iter=100)
STD_EPS = 1e-12  # piecewise.py:16 std_w = torch.std(w) + 1e-12
TOPK_FALLBACK = 5  # quant_acts.py:137 a max <= 0 is redone with the last 5 of the k columns already kept

Bound = Union[float, torch.Tensor]


def study_signed_range(minv: torch.Tensor, maxv: torch.Tensor) -> Tuple[bool, Bound]:
    """The study's signed/unsigned rule on the calibrated bounds (``quant_acts.py:48-55``).

    Returns ``(signed, M)``: ``(False, maxv)`` when ``minv >= 0`` (post-ReLU inputs),
    else ``(True, max(-minv, maxv))`` as a float64 Python number (``uniform.py:11-12``).
    ``maxv`` stays a float32 ``[1]`` tensor in the unsigned case, as in their code:
    that makes the scale a tensor (it matters for the arithmetic, not the value).
    """
    if bool(minv >= 0.0):
        return False, maxv
    return True, max(-float(minv), float(maxv))


def study_uniform(x: torch.Tensor, bits: int, signed: bool, m: Bound) -> torch.Tensor:
    """Their ``uniform_symmetric_quantizer`` (fake quant), ``uniform.py:5-48``.

    ``m`` is the range M (a float for signed, the float32 ``[1]`` buffer for unsigned);
    the operations and their order are theirs: clamp, divide by the scale, round
    half to even, clamp the integer, multiply back. Output has ``x``'s dtype except
    in the unsigned case, where their tensor scale promotes float16 to float32.
    """
    levels = 2 ** bits
    if signed:
        lo, hi = -m, m
        scale = (hi - lo) / (levels - 1)
        # Their ops in their order, in place on the one fresh tensor clamp makes (same values, a third
        # of the memory traffic); the scale is a Python number here, so the dtype stays x's.
        q = torch.clamp(x, min=float(lo), max=float(hi)).div_(scale).round_()
        return q.clamp_(min=-levels / 2, max=levels / 2 - 1).mul_(scale)
    scale = (m - 0) / (levels - 1)
    q = torch.round(torch.clamp(x, min=0.0, max=float(m)) / scale)
    return torch.clamp(q, min=0, max=levels - 1) * scale


def _gaussian_derivative(m: float, p: float) -> float:
    """d(expected MSE)/dp of the non-overlapping PWLQ on N(0,1) (``piecewise.py:92-93``)."""
    from scipy.stats import norm

    return p - 2 * m + 2 * m * norm.cdf(p) + m * norm.pdf(p) * (2 * p - m)


def study_breakpoint(m: float) -> float:
    """Their normalized breakpoint for max|x|/std = ``m``: the bisection of ``piecewise.py:112-131``.

    pw_opt=3 falls into the pw_opt=2 (non-overlapping) branch of the derivative
    (``piecewise.py:87-93``), so this solves the non-overlapping condition.
    Example: ``study_breakpoint(4.0)`` is about 1.392.
    """
    m = float(m)
    left, right = 0, m
    fl = _gaussian_derivative(m, left)
    err, it, mid = 1, 0, None
    while err > BISECTION_TOL and it < BISECTION_MAX_ITER:
        mid = (right - left) / 2.0 + left
        fm = _gaussian_derivative(m, mid)
        if fm * fl > 0:
            left, fl = mid, fm
        else:
            right = mid
        err = np.abs(fm)
        it += 1
    return mid


def study_pwlq(x: torch.Tensor, bits: int, signed: bool, m: Bound) -> torch.Tensor:
    """Their ``piecewise_linear_quant(..., pw_opt=3, approximate=False)`` (fake quant), ``piecewise.py:6-65``.

    The breakpoint comes from this tensor (std over all values, unbiased, and
    max|x|); the tail grid is signed over ``[-M, M]`` even for unsigned inputs
    (``piecewise.py:59`` calls the quantizer with its default ``signed=True``).
    """
    std = torch.std(x) + STD_EPS
    lo, hi = torch.aminmax(x)
    abs_max = torch.maximum(-lo, hi)  # = max(|x|) exactly, without a full |x| tensor
    normalized = abs_max / std
    bpn = study_breakpoint(normalized)
    ratio = bpn if abs_max.item() == 0 else bpn / normalized
    bp = ratio * abs_max
    tail = study_uniform(x, bits, True, float(m))
    middle = study_uniform(x, bits, True, max(-float(-bp), float(bp)))
    # Their two nested torch.where calls (-bp < x, then bp > x) in one: middle exactly where both hold.
    return torch.where((-bp < x) & (bp > x), middle, tail)


def study_weight(w: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """One tensor (a row, or a 1-dim tensor) with their weight rule: signed over its own max|w|.

    An all-zero tensor has scale 0 and would come out NaN; their code skips such
    1-dim tensors (``quant_weis.py:33-34``) and would write NaN for such rows
    (no check in the row loop): here both are left unchanged (a deliberate fix;
    their runs had no such rows, their printed RMSEs are finite).
    """
    m = torch.max(torch.abs(w))
    if float(m) == 0.0:
        return w.clone()
    return study_uniform(w, bits, True, float(m))


def study_weight_rows(w: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Their W8 of one state-dict tensor: per output row when ``w.dim() > 1``, else per tensor.

    Computed on CPU in ``w``'s dtype, as their ``quant_checkpoint`` (``quant_weis.py:21-38``).
    """
    cpu = w.detach().cpu()
    if cpu.dim() <= 1:
        return study_weight(cpu, bits).to(w.device)
    out = cpu.clone()
    for c in range(cpu.shape[0]):
        out[c] = study_weight(cpu[c].clone(), bits)
    return out.to(w.device)


def study_topk_reduce(per_call: torch.Tensor, k: int, side: str) -> torch.Tensor:
    """Their ``act_clip_bounds(..., "top_k", side)`` (``quant_acts.py:130-140``).

    ``per_call`` [calls, n] holds each call's n smallest (``side="min"``) or n largest
    (``"max"``) values, ascending, float32. Lower median of the k extremes per call
    (``torch.median`` picks the lower of two middles), then the plain mean over calls.
    A max that comes out <= 0 is redone with the last 5 columns *of the k already
    kept* (``quant_acts.py:133`` rebinds ``stats`` before ``:137`` slices it): a
    no-op for k <= 5, the 5 largest for k > 5. Only a non-positive max is affected,
    and M ignores it, so the quantized values never depend on this; the stored
    and reported range do.
    """
    stats = per_call[:, :k] if side == "min" else per_call[:, -k:]
    res = torch.mean(torch.median(stats, 1).values)
    if res.item() <= 0 and side == "max":
        stats = stats[:, -TOPK_FALLBACK:]
        res = torch.mean(torch.median(stats, 1).values)
    return res
