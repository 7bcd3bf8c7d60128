"""Streaming range observers with bounded memory, and the non-finite check they share.

Every observer takes ``update(x)`` with ``x`` an already-masked tensor of valid
values (1-D, or ``[tokens, channels]`` for per-channel statistics) and keeps a
state whose size does not depend on the number of updates: raw activations are
never stored. The histogram and moments observers live in
:mod:`ptq_protein.quant.histogram` and :mod:`ptq_protein.quant.stats`.

Non-finite data raise :class:`NonFiniteError` (a ``ValueError``). Observers do not
know their site's name, so the caller re-raises with
``raise err.at_site(name) from err`` to get "NaN in activations at site 'name' ...".
"""

from __future__ import annotations

import torch

__all__ = ["NonFiniteError", "all_finite", "check_finite", "MinMaxObserver", "TopKObserver", "prepare_update",
           "fold_extremes"]

# The study's fallback, kept: when the top-k median of the maxima is <= 0 it uses the
# top 5 instead (PTQ4Protein, piecewise_quant/quant_acts.py, act_clip_bounds).
TOPK_FALLBACK_K = 5


class NonFiniteError(ValueError):
    """NaN or Inf in calibration data; ``at_site(name)`` adds the site to the message."""

    def __init__(self, n_nan: int, n_inf: int, numel: int, site: str | None = None):
        self.n_nan, self.n_inf, self.numel, self.site = n_nan, n_inf, numel, site
        kind = "NaN" if n_nan else "Inf"
        where = f" at site {site!r}" if site else ""
        super().__init__(
            f"{kind} in activations{where} ({n_nan} NaN and {n_inf} Inf of {numel} values); "
            "check the model's float outputs or the masking of padded positions"
        )

    def __reduce__(self):  # picklable across processes despite the custom signature
        return (NonFiniteError, (self.n_nan, self.n_inf, self.numel, self.site))

    def at_site(self, site: str) -> "NonFiniteError":
        """The same error with the site name in its message."""
        return NonFiniteError(self.n_nan, self.n_inf, self.numel, site)


def all_finite(x: torch.Tensor) -> bool:
    """True when ``x`` holds no NaN or Inf (non-float tensors always do).

    Reads the extremes in one pass: NaN propagates through ``aminmax`` and an Inf is
    an extreme, so both are finite exactly when every value is. ``isfinite(x).all()``
    gives the same answer ~4x slower on CPU (a bool temporary of ``x``'s size): the
    swap checks every weight of the model with it (2.3 s of 40 at ESM-2 650M).
    """
    if not x.is_floating_point() or x.numel() == 0:
        return True
    lo, hi = torch.aminmax(x.detach())
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def check_finite(x: torch.Tensor) -> None:
    """Raise :class:`NonFiniteError` if ``x`` holds any NaN or Inf."""
    if not all_finite(x):
        raise NonFiniteError(int(torch.isnan(x).sum()), int(torch.isinf(x).sum()), x.numel())


def prepare_update(x: torch.Tensor, per_channel: bool, seen: torch.Tensor | None,
                   checked: bool = False) -> torch.Tensor | None:
    """Validate an update: float64, flat or ``[tokens, channels]``; None when empty.

    ``seen`` is a per-channel state tensor already held (its length fixes the
    channel count) or None. ``checked=True`` skips the finiteness scan, for a
    caller that already verified the values (calibration checks once per call,
    not once per observer).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"observer update needs a torch.Tensor, got {type(x).__name__}")
    if not checked:
        check_finite(x)
    x = x.detach().to(torch.float64)
    if not per_channel:
        x = x.reshape(-1)
    elif x.dim() != 2:
        raise ValueError(f"per-channel observers need [tokens, channels], got shape {tuple(x.shape)}")
    elif seen is not None and x.shape[1] != seen.shape[0]:
        raise ValueError(f"update has {x.shape[1]} channels but the observer has seen {seen.shape[0]}")
    return x if x.shape[0] else None


def fold_extremes(obs, x: torch.Tensor) -> None:
    """Fold ``x``'s min/max (over dim 0) into ``obs.min_val``/``obs.max_val``."""
    lo, hi = x.amin(0), x.amax(0)
    if obs.min_val is None:
        obs.min_val, obs.max_val = lo, hi
    else:
        obs.min_val, obs.max_val = torch.minimum(obs.min_val, lo), torch.maximum(obs.max_val, hi)


class MinMaxObserver:
    """Running min and max, per tensor or per channel (last dim of ``[tokens, C]``).

    ``min_val``/``max_val`` are float64 scalars (or ``[C]``), exact over all updates.
    """

    def __init__(self, per_channel: bool = False):
        self.per_channel = per_channel
        self.min_val: torch.Tensor | None = None
        self.max_val: torch.Tensor | None = None

    def update(self, x: torch.Tensor, checked: bool = False) -> None:
        """Fold a batch of valid values into the running extremes; empty input is ignored."""
        x = prepare_update(x, self.per_channel, self.min_val, checked)
        if x is not None:
            fold_extremes(self, x)

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(min, max)``; raises ``ValueError`` if no value was observed."""
        if self.min_val is None:
            raise ValueError("MinMaxObserver has seen no values: run calibration data through the site")
        return self.min_val, self.max_val


class TopKObserver:
    """A top-k median clipping range modelled on the study's, in O(1) memory.

    The reduction is the study's (``piecewise_quant/quant_acts.py``
    ``act_clip_bounds``: lower median of each update's k extremes, mean over
    updates, top-5 fallback for a max <= 0), but what it is fed is ours: the
    masked residue values of each calibration *batch*, sub-sampled to at most
    2^16 values, over every batch. The study fed whole tensors (BOS/EOS
    included), one sequence per call, first 50 calls only; that statistic is
    :class:`ptq_protein.quant.study_observer.StudyTopKObserver`. A batch with
    fewer than ``k`` values uses all of them.
    """

    def __init__(self, k: int = 1000):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} must be a positive integer")
        self.k = k
        self.num_updates = 0
        self._sums = torch.zeros(4, dtype=torch.float64)  # lo_k, hi_k, lo_5, hi_5

    def update(self, x: torch.Tensor, checked: bool = False) -> None:
        """Add one batch's top-k medians; empty input is ignored."""
        x = prepare_update(x, per_channel=False, seen=None, checked=checked)
        if x is None:
            return
        self._sums += torch.stack(_topk_medians_pair(x, self.k, TOPK_FALLBACK_K))
        self.num_updates += 1

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lower, upper)`` clipping bounds (float64 scalars)."""
        if self.num_updates == 0:
            raise ValueError("TopKObserver has seen no values: run calibration data through the site")
        lo, hi, _, hi5 = self._sums / self.num_updates
        return lo, (hi5 if hi <= 0 else hi)


def _topk_medians_pair(x: torch.Tensor, k: int, k2: int) -> list:
    """``[lo_k, hi_k, lo_k2, hi_k2]``: lower medians of the ``k`` (``k2``) smallest and largest values."""
    n = x.numel()
    kk = min(max(k, k2), n)
    smallest = _extreme_values(x, kk, largest=False)  # ascending
    largest = _extreme_values(x, kk, largest=True)  # descending
    out = []
    for kj in (min(k, n), min(k2, n)):
        idx = (kj - 1) // 2  # torch.median of an ascending k-set picks element (k-1)//2
        out += [smallest[idx], largest[kj - 1 - idx]]
    return out


TOPK_BLOCK = 64  # values per block of the blocked top-k


def _extreme_values(x: torch.Tensor, k: int, largest: bool) -> torch.Tensor:
    """``torch.topk(x, k, largest=largest).values`` of flat ``x`` (sorted), computed blockwise.

    Split ``x`` into blocks of ``TOPK_BLOCK`` values and keep the ``k`` blocks with
    the most extreme maxima (minima): every value beyond the k-th of those block
    extremes lies in a kept block, and the kept blocks hold at least ``k`` values
    at least that extreme, so the top-k of the kept blocks (plus the ragged tail)
    is exactly the top-k of ``x``. It reads ``x`` once and sorts ~64k values
    instead of all: about 2.5x faster than ``torch.topk`` for k = 100 of 2^16.
    """
    n_blocks = x.numel() // TOPK_BLOCK
    if n_blocks < 4 * k:
        return torch.topk(x, k, largest=largest, sorted=True).values
    blocks = x[:n_blocks * TOPK_BLOCK].view(n_blocks, TOPK_BLOCK)
    extremes = blocks.amax(1) if largest else blocks.amin(1)
    keep = torch.topk(extremes, k, largest=largest, sorted=False).indices
    candidates = torch.cat([blocks.index_select(0, keep).reshape(-1), x[n_blocks * TOPK_BLOCK:]])
    return torch.topk(candidates, k, largest=largest, sorted=True).values
