"""Calibration: run sequences through the model and collect per-site statistics.

Hooks are forward pre-hooks on each activation site's module, registered in a
context manager that removes them in ``finally``. Each hook keeps only the
valid positions (residues; pairs of residues) and feeds bounded-memory
observers: raw activations are never stored, so memory does not grow with the
number of calibration sequences.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import torch
from torch import nn

from ptq_protein.calibration.masks import align_mask, special_positions, valid_boxes
from ptq_protein.calibration.matmul_sites import MatmulInterceptor, subsite_name
from ptq_protein.calibration.sites import Site, set_module
from ptq_protein.models.adapters import Batch, ModelAdapter
from ptq_protein.quant.histogram import HistogramObserver
from ptq_protein.quant.observers import MinMaxObserver, TopKObserver
from ptq_protein.quant.stats import Moments, MomentsObserver
from ptq_protein.recipes.config import Granularity, RangeMethod, SiteKind, TensorQuant
from ptq_protein.support.errors import InputError
from ptq_protein.support.progress import progress as progress_of

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
    history: int = 0  # a fingerprint of the tensors observed so far (see _Observation)
    # Range of the BOS/EOS positions on their own (reported by inspect; they only feed the
    # other statistics with include_special): exact min/max and the number of values.
    special: MinMaxObserver = field(default_factory=MinMaxObserver)
    special_count: int = 0

    _OBSERVERS = ("moments", "minmax", "histogram", "topk", "special")

    def __post_init__(self) -> None:
        per_channel = self.spec.granularity is Granularity.PER_CHANNEL
        self.minmax = MinMaxObserver(per_channel=per_channel)
        if self.spec.range_method is RangeMethod.TOPK:
            self.topk = TopKObserver(k=self.spec.topk)

    @property
    def count(self) -> int:
        return 0 if self.moments.moments is None else int(self.moments.count)

    def update(self, values: Union[torch.Tensor, Sequence[torch.Tensor]], extremes: Optional[tuple] = None) -> None:
        """Fold one call's valid activations, already checked finite, into the statistics.

        ``values`` is ``[n, C]``, or a list of views ``[..., C]`` (one box per
        sequence, see :func:`valid_boxes`) that together hold the valid values.
        ``extremes`` = their ``(min, max)`` when the caller has it (it is the
        finiteness check), so the activation is scanned once for the range; the
        other statistics see a fixed-stride sample of rows, in float64.
        """
        parts = [p for p in ([values] if torch.is_tensor(values) else values) if p.numel()]
        if not parts:
            return
        lo, hi = extremes if extremes is not None else _extremes(parts)
        if self.spec.granularity is Granularity.PER_CHANNEL:
            self.minmax.update(torch.cat([_channel_extremes(p) for p in parts]), checked=True)
        else:
            self.minmax.update(torch.stack([lo, hi]), checked=True)  # same min/max as all values
        sample = _sample(parts, lo, hi)  # its min and max are exactly lo and hi
        self.moments.update(sample, checked=True, extremes=(lo, hi))
        self.histogram.update(sample, checked=True, extremes=(lo, hi))
        if self.topk is not None:
            self.topk.update(sample, checked=True)

    def copy_from(self, other: "SiteStats") -> None:
        """Take ``other``'s statistics (a site that saw exactly the same tensors)."""
        for name in self._OBSERVERS:
            setattr(self, name, _clone_observer(getattr(other, name)))
        self.calls, self.unmasked_calls, self.history = other.calls, other.unmasked_calls, other.history
        self.special_count = other.special_count

    def update_special(self, values: torch.Tensor) -> None:
        """Fold the values at BOS/EOS positions (any shape, already checked finite) into ``special``."""
        if values.numel():
            self.special.update(torch.stack([values.amin(), values.amax()]), checked=True)
            self.special_count += values.numel()


def _clone_observer(obs: Any) -> Any:
    """A copy of ``obs`` that shares no mutable state with it: ``deepcopy``'s result, 20x cheaper.

    Observers hold tensors (some updated in place), numbers and immutable
    :class:`~ptq_protein.quant.stats.Moments`; an observer holding anything else
    is deep-copied.
    """
    if obs is None:
        return None
    state = vars(obs)
    if not all(v is None or isinstance(v, (torch.Tensor, int, float, bool, Moments)) for v in state.values()):
        return copy.deepcopy(obs)
    twin = copy.copy(obs)
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            setattr(twin, name, value.clone())
    return twin


def _extremes(parts: Sequence[torch.Tensor]) -> tuple:
    """``(min, max)`` over every value of ``parts`` (NaN propagates).

    Separate ``amin``/``amax`` passes: ``aminmax`` is ~2x slower on the strided
    per-sequence views of (T, B, C) activations.
    """
    los, his = [p.amin() for p in parts], [p.amax() for p in parts]
    return (los[0], his[0]) if len(parts) == 1 else (torch.stack(los).min(), torch.stack(his).max())


def _channel_extremes(part: torch.Tensor) -> torch.Tensor:
    """``[2, C]``: per-channel min and max of a ``[..., C]`` view."""
    dims = tuple(range(part.dim() - 1))
    return torch.stack([part.amin(dims), part.amax(dims)])


def _sample(parts: Sequence[torch.Tensor], lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Flat float64 sample: every ``stride``-th row of each part, so about MAX_SAMPLED_VALUES values."""
    stride = -(-sum(p.numel() for p in parts) // MAX_SAMPLED_VALUES)
    if stride == 1:
        flat = [p.reshape(-1) for p in parts]
    else:  # keep this call's exact extremes in the histogram's support
        flat = [p.reshape(-1, p.shape[-1])[::stride].reshape(-1) for p in parts] + [torch.stack([lo, hi])]
    return (flat[0] if len(flat) == 1 else torch.cat(flat)).to(torch.float64)


def _first_tensor(args, kwargs) -> Optional[torch.Tensor]:
    if args and torch.is_tensor(args[0]):
        return args[0]
    for key in ("input", "hidden_states", "x"):
        if torch.is_tensor(kwargs.get(key)):
            return kwargs[key]
    return None


@dataclass
class _Observation:
    """The most recently observed activation and the statistics it produced.

    Sites fed the very same tensor (the q/k/v projections of one attention
    input) would compute identical statistics: when the next site gets the same
    object, unmodified, with the same spec and the same history, it copies them.
    Holding only the latest tensor keeps memory bounded and rules out a freed
    tensor's address being reused by another.
    """

    tensor: torch.Tensor
    version: int
    channel_last: bool
    history_before: int
    stats: SiteStats

    def shared_with(self, x: torch.Tensor, stats: SiteStats, channel_last: bool) -> bool:
        return (self.tensor is x and self.version == _version(x) and self.channel_last == channel_last
                and self.stats is not stats and self.stats.spec == stats.spec
                and self.history_before == stats.history)


def _version(x: torch.Tensor) -> Optional[int]:
    try:
        return x._version
    except RuntimeError:  # inference tensors keep no version counter
        return None


class _MaskState:
    """The current batch, its per-shape masks and the last observation, read by every hook.

    With ``include_special`` the BOS/EOS positions count as valid (the batch's
    token mask is widened to them); padding never does.
    """

    def __init__(self, include_special: bool = False) -> None:
        self.include_special = include_special
        self._batch: Optional[Batch] = None
        self._boxes: Dict[tuple, Any] = {}
        self._special: Dict[tuple, Any] = {}
        self.last: Optional[_Observation] = None
        self.observations = itertools.count(1)

    @property
    def batch(self) -> Optional[Batch]:
        return self._batch

    @batch.setter
    def batch(self, batch: Optional[Batch]) -> None:
        if batch is not None and self.include_special and batch.special_mask is not None:
            batch = dataclasses.replace(batch, token_mask=batch.token_mask | batch.special_mask)
        self._batch, self._boxes, self._special, self.last = batch, {}, {}, None

    def special(self, x: torch.Tensor, channel_last: bool) -> Optional[torch.Tensor]:
        """Mask of the BOS/EOS positions of ``x`` (cached per shape), or None when it has none."""
        b = self._batch
        if b is None or b.special_mask is None:
            return None
        key = (tuple(x.shape), channel_last, x.device)
        if key not in self._special:
            special = b.special_mask.to(x.device)
            computed = b.token_mask.to(x.device) | special
            self._special[key] = special_positions(x.shape, computed, special, channel_last)
        return self._special[key]

    def boxes(self, x: torch.Tensor, channel_last: bool):
        """Per-sequence boxes of valid positions (cached per shape), or None."""
        key = (tuple(x.shape), channel_last, x.device)
        if key not in self._boxes:
            b = self._batch
            self._boxes[key] = valid_boxes(x.shape, b.token_mask.to(x.device), b.residue_mask.to(x.device),
                                           channel_last=channel_last)
        return self._boxes[key]


def _valid_values(x: torch.Tensor, state: _MaskState, stats: SiteStats,
                  channel_last: bool = True) -> List[torch.Tensor]:
    """The valid values of ``x``: views ``[..., C]`` (one per sequence) where the masks allow, else ``[[n, C]]``."""
    x = x.detach()
    batch = state.batch
    if batch is not None:
        boxes = state.boxes(x, channel_last)
        if boxes is not None:
            return [x[box].float() if channel_last else x[box].float().unsqueeze(-1) for box in boxes]
    mask = None if batch is None else align_mask(x.shape, batch.token_mask.to(x.device),
                                                 batch.residue_mask.to(x.device),
                                                 channel_last=channel_last)
    if mask is None:
        stats.unmasked_calls += 1
        return [x.reshape(-1, x.shape[-1]).float()]
    if not channel_last:
        return [x[mask.expand(x.shape)].float().reshape(-1, 1)]
    mask = mask.expand(*x.shape[:-1], 1).squeeze(-1)
    return [x[mask].float()]


def _observe(x: torch.Tensor, state: _MaskState, stats: SiteStats, channel_last: bool = True) -> None:
    """Fold one call's valid values of ``x`` into ``stats`` (or copy a site that saw this very tensor)."""
    last = state.last
    if last is not None and last.shared_with(x, stats, channel_last):
        stats.copy_from(last.stats)
        return
    before = stats.history
    stats.calls += 1
    parts = _valid_values(x, state, stats, channel_last)
    stats.history = hash((before, next(state.observations)))
    version = _version(x)
    state.last = None if version is None else _Observation(x, version, channel_last, before, stats)
    parts = [p for p in parts if p.numel()]
    special = state.special(x, channel_last)
    if special is not None:
        parts_special = x.detach()[special.expand(x.shape)].float()
        _check_finite(parts_special, stats)
        stats.update_special(parts_special)
    if not parts:
        return
    extremes = _extremes(parts)
    if not all(map(torch.isfinite, extremes)):  # NaN/Inf always reach the extremes
        _check_finite(torch.cat([p.reshape(-1) for p in parts]), stats)
    stats.update(parts, extremes)


def _check_finite(values: torch.Tensor, stats: SiteStats) -> None:
    if bool(torch.isfinite(values).all()):
        return
    kind = "NaN" if bool(torch.isnan(values).any()) else "Inf"
    raise InputError(
        f"{kind} in activations at site {stats.site.name} during calibration: the float model itself "
        "produces non-finite values on these sequences; check the weights, or use --dtype float32"
    )


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
def collect_stats(model: nn.Module, sites: Sequence[Site], specs: Dict[str, TensorQuant],
                  include_special: bool = False) -> Iterator[tuple]:
    """Attach observers to ``sites``; yields (stats by site name, mask state)."""
    modules = dict(model.named_modules())
    state = _MaskState(include_special)
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
              sequences: Sequence[str], batch_size: Optional[int] = None, progress: bool = False,
              forward_kwargs: Optional[dict] = None, include_special: bool = False) -> Dict[str, SiteStats]:
    """Run ``sequences`` through ``model`` and return statistics per activation site.

    Residue positions feed the statistics; BOS/EOS positions too with
    ``include_special`` (``SpecialTokens.INCLUDE``), and their own min/max
    always (``SiteStats.special``). Padding never does. ``batch_size`` None is the
    family's default (:attr:`ModelAdapter.calibration_batch`).

    Sites that never saw a valid value are reported by the caller (they stay in
    floating point); a site whose layout could not be aligned with the masks is
    logged, and its statistics include every position.
    """
    if not sequences:
        raise InputError("the calibration set is empty: give at least one sequence (a FASTA file, a set such as "
                         "casp14:50, or a list)")
    forward_kwargs = forward_kwargs or {}
    batches: List[Batch] = list(adapter.batches(list(sequences), batch_size))
    iterator = progress_of(batches, "calibrating", "batches", show=progress)
    was_training = model.training
    model.eval()
    try:
        collecting = collect_stats(model, sites, specs, include_special)
        with torch.no_grad(), adapter.calibration_mode(model), collecting as (stats, state):
            for batch in iterator:
                state.batch = batch
                adapter.forward_for_sites(model, batch, sites, **forward_kwargs)
            state.batch = None
    finally:
        model.train(was_training)
    for s in stats.values():
        if s.unmasked_calls:
            log.warning("site %s: could not align the padding mask with its activation shape in %d of %d calls; "
                        "its statistics include padding/special positions", s.site.name, s.unmasked_calls, s.calls)
    return stats
