"""The study's range statistic as an observer: top-k extremes of the first calls, whole tensors.

Their calibration quantizer (``piecewise_quant/quant_acts.py:35-44``) sorts the
whole input of each call (no mask: BOS/EOS included; batch 1, so no padding)
and keeps the 1000 smallest and 1000 largest values of the first
``cali_sample_size // cali_batch_size = 50`` calls; later calls are ignored.
The reduction (``quant_acts.py:130-140``) only reads the k extremes at either
end (its fallback for a max <= 0 re-slices those k columns), so this observer
keeps ``max(k, 5)`` per side per call, which gives the same result and lets one
pass serve recipes at several k.

One deliberate difference: their buffer has 50 rows whatever happened, so a
quantizer called fewer than 50 times averages zero rows into its mean. In their
runs every executed quantizer was called at least 50 times (the calibration set
has 50 sequences), so the two agree there; here the mean is over the calls seen,
so a smaller calibration set does not shrink the ranges toward zero.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ptq_protein.quant.study import TOPK_FALLBACK, study_topk_reduce

__all__ = ["StudyTopKObserver", "STUDY_CALLS", "extremes", "float_reason"]

STUDY_CALLS = 50  # quant_acts.py:17,28 cali_sample_size=50 // cali_batch_size=1


class StudyTopKObserver:
    """Per call, the ``max(k, 5)`` smallest and largest values of the whole tensor (first ``calls`` calls).

    ``bounds()`` returns the calibrated ``(min, max)`` as float32 0-dim tensors,
    exactly as their ``act_clip_bounds`` computes them from the same calls.
    """

    def __init__(self, k: int, calls: int = STUDY_CALLS):
        if k < 1 or calls < 1:
            raise ValueError(f"k={k} and calls={calls} must be at least 1")
        self.k, self.calls = k, calls
        self.keep = max(k, TOPK_FALLBACK)
        self._mins: List[torch.Tensor] = []
        self._maxs: List[torch.Tensor] = []
        self.seen = 0  # every call, also those past ``calls``

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold one call's whole input (any shape, any float dtype)."""
        self.seen += 1
        if len(self._mins) >= self.calls or x.numel() == 0:
            return
        # The values are stored ascending in float32, as their float32 buffer stores them
        # (quant_acts.py:29-31,42-43).
        lo, hi = extremes(x.detach().reshape(-1), self.keep)
        self._mins.append(_pad(lo.float().cpu(), self.keep, front=False))
        self._maxs.append(_pad(hi.float().cpu(), self.keep, front=True))

    @property
    def count(self) -> int:
        """Calls that contribute (at most ``calls``)."""
        return len(self._mins)

    def bounds(self, k: Optional[int] = None) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """``(min, max)`` float32 0-dim tensors at top-``k`` (default ``self.k``), or None when no call was seen.

        Any ``k <= self.keep`` gives what an observer built for that ``k`` gives: the
        ``k`` extremes of a call are the first ``k`` of its ``keep`` sorted extremes,
        so one pass serves recipes at top-1 and top-2 alike.
        """
        k = self.k if k is None else k
        if not 1 <= k <= self.keep:
            raise ValueError(f"this observer kept the {self.keep} extremes of each call; top-{k} needs a pass "
                             f"built with k >= {k}")
        if not self._mins:
            return None
        mins, maxs = torch.stack(self._mins), torch.stack(self._maxs)
        return study_topk_reduce(mins, k, "min"), study_topk_reduce(maxs, k, "max")


def float_reason(observer: StudyTopKObserver, k: Optional[int] = None) -> Optional[str]:
    """Why a site with these statistics cannot be quantized the study's way (None: it can).

    A site that never ran has no range; one whose calibrated range is 0 at both
    ends saw only zeros (ESMFold's recycle norms on their first, all-zero pass),
    where their quantizer's assert (``uniform.py:37-44``) would fail.
    """
    bounds = observer.bounds(k)
    if bounds is None:
        return "never ran during calibration"
    if float(bounds[0]) >= 0.0 >= float(bounds[1]):
        return f"ran {observer.seen} time(s), only on all-zero inputs"
    return None


def extremes(flat: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` smallest and ``k`` largest values of a 1-D tensor, both ascending: the values a full sort gives.

    Two ``torch.topk`` calls over a whole ESMFold pair tensor cost ~3x the forward
    that made it, so large tensors are pre-filtered, exactly: cut into rows of
    ``_ROW`` values, the k-th smallest row minimum ``t`` bounds the k-th smallest
    value from above (those k minima are k values <= t), and every value <= t lies
    in a row whose minimum is <= t; ``topk`` then runs on those rows only
    (typically k of them; ties may select many, which is slower, never different).
    Likewise for the largest. A NaN anywhere takes the plain path (topk orders NaN
    as largest, which a threshold cannot reproduce).
    """
    n = min(k, flat.numel())
    whole = flat.numel() // _ROW * _ROW
    if whole >= _PREFILTER_MIN:
        rows, rest = flat[:whole].view(-1, _ROW), flat[whole:]
        row_lo, row_hi = rows.amin(dim=1), rows.amax(dim=1)
        if not (torch.isnan(row_lo).any() or torch.isnan(row_hi).any() or torch.isnan(rest).any()):
            t_lo = torch.topk(row_lo, n, largest=False, sorted=True).values[-1]
            t_hi = torch.topk(row_hi, n, largest=True, sorted=True).values[-1]
            lo_pool = torch.cat([rows[row_lo <= t_lo].reshape(-1), rest])
            hi_pool = torch.cat([rows[row_hi >= t_hi].reshape(-1), rest])
            return _topk_both(lo_pool, hi_pool, n)
    return _topk_both(flat, flat, n)


def _topk_both(for_lo: torch.Tensor, for_hi: torch.Tensor, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    lo = torch.topk(for_lo, n, largest=False, sorted=True).values
    hi = torch.topk(for_hi, n, largest=True, sorted=True).values.flip(0)
    return lo, hi


_ROW = 1024
_PREFILTER_MIN = 1 << 15  # below this, two plain topk calls are already cheap


def _pad(values: torch.Tensor, size: int, front: bool) -> torch.Tensor:
    """Pad a call with fewer than ``size`` values by repeating its innermost extreme.

    Only a tensor with fewer values than k needs it (their code would have failed
    on one with fewer than 1000, ``quant_acts.py:42``); never on ESMFold or ESM-2.
    """
    missing = size - values.numel()
    if missing <= 0:
        return values
    if front:
        return torch.cat([values[:1].expand(missing), values])
    return torch.cat([values, values[-1:].expand(missing)])
