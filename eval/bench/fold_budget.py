"""Before each fold: will it fit? Choose the chunk size, or refuse the sequence in one line.

The memory model is :mod:`ptq_protein.models.fold_memory`. The budget is
``max_memory`` bytes for the whole process, by default what it holds now plus
90% of what the machine has available (``MemAvailable``; the rest is headroom for
the prediction's error). Chunk sizes are tried from
the model's own (unchunked first when it runs unchunked) down to the smallest;
the first whose predicted peak fits is used for this sequence only. The
prediction starts from what the process holds before the fold (freed heap pages
returned first) when that is more than the model's runtime and weights.

While each fold runs, its own peak is polled (:class:`~ptq_protein.support.rss_peak.PeakSampler`: the
process's resident size read every 5 ms; the kernel's peak mark, which ``/usr/bin/time`` and
``ru_maxrss`` report, is never reset). Every later fold of that model in this process is planned
with the largest measured ratio of peak to prediction as a margin, so a miss cannot repeat in a
run of many sequences. A warning is said only where the memory check changes something: a fold
whose peak went over the budget, and a fold whose plan (chunk size, or a refusal) the margin
changed. A peak over its prediction that changes no plan is logged at debug level only: the
prediction is an estimate (:data:`TOLERANCE`), and with a budget far above the need a miss of
any size changes nothing, so a warning there would only be noise.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Iterator, Optional

from torch import nn

from ptq_protein.models.fold_memory import CHUNK_CHOICES, FoldPlan, choose_plan, dims_of, predict_peak
from ptq_protein.support.errors import InputError
from ptq_protein.support.process_memory import release_freed_memory
from ptq_protein.support.rss_peak import PeakSampler
from ptq_protein.workflows.memory_budget import (  # noqa: F401 (DEFAULT_SHARE re-exported)
    DEFAULT_SHARE,
    process_budget,
    resident_bytes,
)

__all__ = ["FoldRefused", "planned_fold", "fold_budget", "longest_fitting", "resident_before_fold"]

log = logging.getLogger(__name__)

_GIB = 2 ** 30
TOLERANCE = 1.15  # the memory model's stated accuracy: a fold's peak over its prediction by more is reported
_MARGINS: "weakref.WeakKeyDictionary[nn.Module, float]" = weakref.WeakKeyDictionary()  # measured peak / predicted


class FoldRefused(InputError):
    """A sequence whose fold would not fit in the memory budget: the message has the estimate and what would fit."""


def fold_budget(max_memory: Optional[int] = None) -> Optional[int]:
    """Bytes the fold's process may use (:func:`~ptq_protein.workflows.memory_budget.process_budget`)."""
    return process_budget(max_memory)


@contextlib.contextmanager
def planned_fold(model: nn.Module, length: int, max_memory: Optional[int] = None,
                 recycles: Optional[int] = None) -> Iterator[Optional[FoldPlan]]:
    """Run a fold of ``length`` residues (``recycles``: None, the model's own) under the plan that fits (the
    trunk's chunk size set meanwhile).

    Raises :class:`FoldRefused` when no chunk size fits the budget. Models without an
    ESMFold trunk config, or a machine whose free memory is unknown, fold unchecked.
    """
    trunk = getattr(model, "trunk", None)
    budget = fold_budget(max_memory)
    if budget is None or not hasattr(trunk, "set_chunk_size") or not hasattr(model, "config"):
        yield None
        return
    own = trunk.chunk_size
    dims, bits = dims_of(model), getattr(model, "pair_bits", None)
    chunks = CHUNK_CHOICES if own is None else [c for c in CHUNK_CHOICES if c is not None and c <= own]
    resident = resident_before_fold()
    margin = _MARGINS.get(model, 1.0)
    room = int(budget / margin)  # an earlier fold of this model peaked above its prediction: keep that margin
    plan = choose_plan(dims, length, room, pair_bits=bits, chunks=chunks, resident=resident, recycles=recycles)
    if plan is None:
        raise FoldRefused(_refusal(model, length, room, bits, min(c for c in chunks if c is not None), resident,
                                   recycles) + _margin_note(margin))
    predicted = predict_peak(dims, plan, resident)
    unmargined = plan if margin == 1.0 else choose_plan(dims, length, budget, pair_bits=bits, chunks=chunks,
                                                        resident=resident, recycles=recycles)
    if plan.chunk != own:
        log.warning("%d residues: predicted peak %.1f GiB within the %.1f GiB budget with %s (the model's: %s)%s",
                    length, predicted * margin / _GIB, budget / _GIB, plan.describe(),
                    "unchunked" if own is None else own, "" if unmargined == plan else _margin_note(margin))
    trunk.set_chunk_size(plan.chunk)
    sampler = PeakSampler()
    try:
        with sampler:
            yield plan
    finally:
        trunk.set_chunk_size(own)
    _check_peak(model, length, predicted, budget, sampler.peak)


def _check_peak(model: nn.Module, length: int, predicted: int, budget: int, peak: Optional[int]) -> None:
    """Keep the fold's polled peak over its prediction as this model's margin (when above the last); warn in one
    line only when the peak went over the budget. Over the prediction yet within the budget, the plan this fold
    ran was still the right one (a plan fits as long as its peak does), so that is said at debug level only;
    a later fold whose plan the margin changes says so when it is planned (:func:`planned_fold`)."""
    if not peak or not predicted:
        return
    ratio = peak / predicted
    if ratio > _MARGINS.get(model, 1.0):
        _MARGINS[model] = ratio
    missed = f"{100 * (ratio - 1):.0f}% over its predicted {predicted / _GIB:.2f} GiB" if ratio > 1 else ""
    if peak <= budget:
        if missed:
            log.debug("%d residues: this fold peaked at %.2f GiB (polled), %s, within the %.2f GiB budget", length,
                      peak / _GIB, missed, budget / _GIB)
        return
    said = [missed] if ratio > TOLERANCE else []
    said.append(f"{100 * (peak / budget - 1):.0f}% over the {budget / _GIB:.2f} GiB memory budget (--max-memory, "
                "or by default 90% of what the machine had available)")
    later = "; later folds in this run are planned with that margin" if ratio > 1 else ""
    log.warning("%d residues: this fold peaked at %.2f GiB (polled), %s%s", length, peak / _GIB, " and ".join(said),
                later)


def _margin_note(margin: float) -> str:
    return (f" (planned with a {100 * (margin - 1):.0f}% margin: an earlier fold in this run peaked that far over "
            "its prediction)")


def resident_before_fold() -> int:
    """Bytes this process holds before a fold (VmRSS, 0 where unknown), its freed heap pages returned first.

    The memory model's runtime was measured on one CPU install; a process that holds more (a CUDA
    build of torch, other models, an earlier fold) starts its fold from there.
    """
    release_freed_memory()
    return resident_bytes()


def longest_fitting(model: nn.Module, budget: int, pair_bits: Optional[int], chunk: int,
                    resident: Optional[int] = None, recycles: Optional[int] = None) -> int:
    """The longest length (residues) whose predicted peak at ``chunk`` is within ``budget`` bytes (0: none).

    ``resident``: as :func:`~ptq_protein.models.fold_memory.predict_peak`'s; ``recycles``: as ``FoldPlan``'s.
    """
    dims = dims_of(model)

    def fits(n: int) -> bool:
        return predict_peak(dims, FoldPlan(n, 1, chunk, pair_bits, recycles), resident) <= budget

    low, high = 0, 1
    while fits(high) and high < 1 << 20:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _refusal(model: nn.Module, length: int, budget: int, bits: Optional[int], smallest: int, resident: int,
             recycles: Optional[int]) -> str:
    need = predict_peak(dims_of(model), FoldPlan(length, 1, smallest, bits, recycles), resident)
    text = (f"{length} residues need ~{need / _GIB:.1f} GiB even at chunk size {smallest}"
            f"{'' if bits is None else f' with int{bits} pair activations'}, over the {budget / _GIB:.1f} GiB "
            f"budget; up to {longest_fitting(model, budget, bits, smallest, resident, recycles)} residues fit")
    if bits is None:
        text += f" (with --pair-bits 8: up to {longest_fitting(model, budget, 8, smallest, resident, recycles)})"
    return text + "; raise --max-memory or use a machine with more memory"
