"""Calibration: run sequences through the model and collect per-site statistics.

Hooks are forward pre-hooks on each activation site's module, registered in a
context manager that removes them in ``finally``. Each hook keeps only the
valid positions (residues; pairs of residues) and feeds bounded-memory
observers: raw activations are never stored, so memory does not grow with the
number of calibration sequences.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence

import torch
from torch import nn

from ptq_protein.adapters import Batch, ModelAdapter
from ptq_protein.config import Granularity, RangeMethod, SiteKind, TensorQuant
from ptq_protein.errors import InputError
from ptq_protein.masks import align_mask
from ptq_protein.matmul_sites import MatmulInterceptor, subsite_name
from ptq_protein.quant.histogram import HistogramObserver
from ptq_protein.quant.observers import MinMaxObserver, TopKObserver
from ptq_protein.quant.stats import MomentsObserver
from ptq_protein.sites import Site, set_module

__all__ = ["SiteStats", "calibrate", "collect_stats"]

log = logging.getLogger(__name__)

HISTOGRAM_BINS = 2048
# Per call, moments/histogram/top-k see at most this many values (a fixed-stride subset of
# the valid rows); min/max always see every value. ESMFold's pair tensors hold L^2 x C
# values per call, so exact statistics would cost more than the forward pass itself.
MAX_SAMPLED_VALUES = 1 << 16


@dataclass
class SiteStats:
    """Bounded-memory statistics of one activation site."""

    site: Site
    spec: TensorQuant
    moments: MomentsObserver = field(default_factory=MomentsObserver)
    minmax: Optional[MinMaxObserver] = None
    histogram: HistogramObserver = field(default_factory=lambda: HistogramObserver(bins=HISTOGRAM_BINS))
    topk: Optional[TopKObserver] = None
    calls: int = 0
    unmasked_calls: int = 0

    def __post_init__(self) -> None:
        per_channel = self.spec.granularity is Granularity.PER_CHANNEL
        self.minmax = MinMaxObserver(per_channel=per_channel)
        if self.spec.range_method is RangeMethod.TOPK:
            self.topk = TopKObserver(k=self.spec.topk)

    @property
    def count(self) -> int:
        return 0 if self.moments.moments is None else int(self.moments.count)

    def update(self, values: torch.Tensor, extremes: Optional[tuple] = None) -> None:
        """``values``: [n, C] valid activations of one call, already checked finite.

        ``extremes`` = ``torch.aminmax(values)`` when the caller has it (it is the
        finiteness check), so the full tensor is scanned once for the range; the
        other statistics see a sample in float64.
        """
        if values.numel() == 0:
            return
        lo, hi = extremes if extremes is not None else torch.aminmax(values)
        if self.spec.granularity is Granularity.PER_CHANNEL:
            self.minmax.update(values, checked=True)
        else:
            self.minmax.update(torch.stack([lo, hi]), checked=True)  # same min/max as all values
        stride = -(-values.numel() // MAX_SAMPLED_VALUES)
        sample = values.reshape(-1)
        if stride > 1:  # keep this call's exact extremes in the histogram's support
            sample = torch.cat([values[::stride].reshape(-1), torch.stack([lo, hi])])
        sample = sample.to(torch.float64)
        self.moments.update(sample, checked=True)
        self.histogram.update(sample, checked=True)
        if self.topk is not None:
            self.topk.update(sample, checked=True)


def _first_tensor(args, kwargs) -> Optional[torch.Tensor]:
    if args and torch.is_tensor(args[0]):
        return args[0]
    for key in ("input", "hidden_states", "x"):
        if torch.is_tensor(kwargs.get(key)):
            return kwargs[key]
    return None


class _MaskState:
    """The current batch's masks, read by every hook."""

    batch: Optional[Batch] = None


def _valid_values(x: torch.Tensor, state: _MaskState, stats: SiteStats, channel_last: bool = True) -> torch.Tensor:
    x = x.detach()
    batch = state.batch
    mask = None if batch is None else align_mask(x.shape, batch.token_mask.to(x.device), batch.residue_mask.to(x.device),
                                                 channel_last=channel_last)
    if mask is None:
        stats.unmasked_calls += 1
        return x.reshape(-1, x.shape[-1]).float()
    if not channel_last:
        return x[mask.expand(x.shape)].float().reshape(-1, 1)
    mask = mask.expand(*x.shape[:-1], 1).squeeze(-1)
    return x[mask].float()


def _observe(x: torch.Tensor, state: _MaskState, stats: SiteStats, channel_last: bool = True) -> None:
    stats.calls += 1
    values = _valid_values(x, state, stats, channel_last)
    if values.numel() == 0:
        return
    extremes = torch.aminmax(values)
    if not all(map(torch.isfinite, extremes)):  # NaN/Inf always reach the extremes
        kind = "NaN" if torch.isnan(values).any() else "Inf"
        raise InputError(
            f"{kind} in activations at site {stats.site.name} during calibration: the float model itself "
            "produces non-finite values on these sequences; check the weights, or use --dtype float32"
        )
    stats.update(values, extremes)


class _RecordingHost(nn.Module):
    """Calibration stand-in for a MATMUL host: observes every product operand, changes nothing."""

    def __init__(self, module: nn.Module, site: Site, spec: TensorQuant, stats: Dict[str, SiteStats],
                 state: _MaskState):
        super().__init__()
        self.module = module
        self._site, self._spec, self._stats, self._state = site, spec, stats, state

    def _record(self, call: int, operand: int, x: torch.Tensor) -> torch.Tensor:
        if x.is_floating_point():
            name = subsite_name(self._site.name, call, operand)
            if name not in self._stats:
                sub = Site(name, SiteKind.MATMUL, self._site.group, self._site.module_type, self._site.is_head)
                self._stats[name] = SiteStats(sub, self._spec)
            _observe(x, self._state, self._stats[name], channel_last=False)
        return x

    def forward(self, *args, **kwargs):
        with MatmulInterceptor(self._record):
            return self.module(*args, **kwargs)


@contextlib.contextmanager
def collect_stats(model: nn.Module, sites: Sequence[Site], specs: Dict[str, TensorQuant]) -> Iterator[tuple]:
    """Attach observers to ``sites``; yields (stats by site name, mask state)."""
    modules = dict(model.named_modules())
    state = _MaskState()
    stats: Dict[str, SiteStats] = {}
    handles, swapped = [], []
    try:
        for site in sites:
            if site.kind is SiteKind.MATMUL:
                set_module(model, site.name, _RecordingHost(modules[site.name], site, specs[site.name], stats, state))
                swapped.append(site.name)
                continue
            stats[site.name] = SiteStats(site, specs[site.name])
            handles.append(modules[site.name].register_forward_pre_hook(_make_hook(stats[site.name], state),
                                                                        with_kwargs=True))
        yield stats, state
    finally:
        for handle in handles:
            handle.remove()
        for name in swapped:
            set_module(model, name, modules[name])


def _make_hook(stats: SiteStats, state: _MaskState):
    def hook(module, args, kwargs):
        x = _first_tensor(args, kwargs)
        if x is not None and x.is_floating_point():
            _observe(x, state, stats)
        return None

    return hook


def calibrate(model: nn.Module, adapter: ModelAdapter, sites: Sequence[Site], specs: Dict[str, TensorQuant],
              sequences: Sequence[str], batch_size: int = 8, progress: bool = False,
              forward_kwargs: Optional[dict] = None) -> Dict[str, SiteStats]:
    """Run ``sequences`` through ``model`` and return statistics per activation site.

    Sites that never saw a valid value are reported by the caller (they stay in
    floating point); a site whose layout could not be aligned with the masks is
    logged, and its statistics include every position.
    """
    if not sequences:
        raise InputError("the calibration set is empty: give at least one sequence (a FASTA file, a set such as casp14:50, or a list)")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1")
    forward_kwargs = forward_kwargs or {}
    batches: List[Batch] = list(adapter.batches(list(sequences), batch_size))
    iterator = batches
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(batches, desc="calibrating", unit="batch")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), adapter.calibration_mode(model), collect_stats(model, sites, specs) as (stats, state):
            for batch in iterator:
                state.batch = batch
                adapter.forward(model, batch, **forward_kwargs)
            state.batch = None
    finally:
        model.train(was_training)
    for s in stats.values():
        if s.unmasked_calls:
            log.warning("site %s: could not align the padding mask with its activation shape in %d of %d calls; "
                        "its statistics include padding/special positions", s.site.name, s.unmasked_calls, s.calls)
    return stats
