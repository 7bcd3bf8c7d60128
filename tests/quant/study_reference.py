"""An independent re-implementation of the PTQ4Protein study's quantizers, for the parity tests.

Written from reading their ``piecewise_quant`` package (commit 605deb2), not
copied, and deliberately shaped like *their* code rather than like
``ptq_protein.quant.study``: a stateful calibration module with a
``[50, 1000]`` buffer filled by a full sort, in-place rebinding of its bounds on
every call, NumPy ``np.max`` for the range, a separate bisection, and a W8 that
walks a state dict row by row.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import norm


def ref_uniform(x, bits, minv, maxv, signed=True):
    """uniform.py:5-48 (simulated)."""
    if signed:
        top = np.max([-float(minv), float(maxv)])
        bottom = -top
    else:
        top, bottom = maxv, 0
    n = 2 ** bits
    step = (top - bottom) / (n - 1)
    y = torch.round(torch.clamp(x, min=float(bottom), max=float(top)) / step)
    y = torch.clamp(y, min=-n / 2, max=n / 2 - 1) if signed else torch.clamp(y, min=0, max=n - 1)
    return y * step


def ref_bisect(m):
    """piecewise.py:112-131 with the pw_opt=2 derivative (:92-93), Gaussian."""
    m = float(m)

    def slope(p):
        return p - 2 * m + 2 * m * norm.cdf(p) + m * norm.pdf(p) * (2 * p - m)

    lo, hi, f_lo = 0, m, slope(0)
    for _ in range(100):
        mid = lo + (hi - lo) / 2.0
        f_mid = slope(mid)
        if f_mid * f_lo > 0:
            lo, f_lo = mid, f_mid
        else:
            hi = mid
        if np.abs(f_mid) <= 1e-3:
            break
    return mid


def ref_pwlq3(x, bits, minv, maxv, signed):
    """piecewise.py:6-29 + the pw_opt=3 branch (:58-65)."""
    if signed:
        top = np.max([-float(minv), float(maxv)])
        bottom = -top
    else:
        top, bottom = maxv, 0
    sd = torch.std(x) + 1e-12
    amax = torch.max(torch.abs(x))
    ratio_n = amax / sd
    bp_n = ref_bisect(ratio_n)
    bp = (bp_n if amax.item() == 0 else bp_n / ratio_n) * amax
    tail = ref_uniform(x, bits, bottom, top, signed=True)
    centre = ref_uniform(x, bits, -bp, bp, signed=True)
    inside = (-bp < x) & (bp > x)
    return torch.where(inside, centre, tail)


class RefQuantAct(torch.nn.Module):
    """quant_acts.py:14-68: statistics mode (``bits=0``) or quantize mode with bounds set afterwards."""

    def __init__(self, bits, get_stats, scheme="uniform", samples=50, topk=1000):
        super().__init__()
        self.bits, self.get_stats, self.scheme = bits, get_stats, scheme
        self.samples, self.topk, self.index = samples, topk, 0
        shape = (samples, topk) if get_stats else 1
        self.register_buffer("minv", torch.zeros(shape))
        self.register_buffer("maxv", torch.zeros(shape))

    def forward(self, x):
        if self.get_stats:
            ordered = torch.sort(torch.reshape(x.clone(), (-1,))).values
            if self.index < self.samples:
                self.minv[self.index, :] = ordered[:self.topk]
                self.maxv[self.index, :] = ordered[-self.topk:]
                self.index += 1
        if self.bits > 0:
            if self.minv >= 0.0:
                self.minv *= 0.0
                self.signed = False
            else:
                self.maxv = max(-self.minv, self.maxv)
                self.minv = -self.maxv
                self.signed = True
            fn = ref_pwlq3 if self.scheme == "pwlq-3" else ref_uniform
            x = fn(x, self.bits, self.minv, self.maxv, self.signed)
        return x


def ref_clip(stats, k, side):
    """quant_acts.py:130-140 (top_k), statement by statement.

    Their line 133 rebinds ``stats`` to the k kept columns, so the fallback's
    ``stats[:, -5:]`` (line 137) slices those k columns, not the whole buffer:
    for k <= 5 it recomputes the same value. Kept in their shape on purpose.
    """
    stats = stats[:, :k] if side == "min" else stats[:, -k:]
    out = torch.mean(torch.median(stats, 1)[0])
    if out.item() <= 0 and side == "max":
        stats = stats[:, -5:]
        out = torch.mean(torch.median(stats, 1)[0])
    return out


def ref_w8_state(state, keys):
    """quant_weis.py:8-51 with the 'uni' scheme: rows of >= 2-D tensors, 1-D tensors whole."""
    out = dict(state)
    for key in keys:
        t = state[key].clone()
        if t.dim() > 1:
            for c in range(t.size()[0]):
                row = t[c, :].clone().cpu()
                t[c, :] = ref_uniform(row, 8, -torch.max(torch.abs(row)), torch.max(torch.abs(row)))
        else:
            q = ref_uniform(t.cpu(), 8, -torch.max(torch.abs(t)), torch.max(torch.abs(t)))
            if np.isnan(float(torch.sum((q - t) ** 2))):
                continue
            t = q
        out[key] = t
    return out
