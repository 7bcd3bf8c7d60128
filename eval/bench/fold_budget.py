"""Before each fold: will it fit? Choose the chunk size, or refuse the sequence in one line.

The memory model is :mod:`ptq_protein.models.fold_memory`. The budget is
``max_memory`` bytes for the whole process, by default what it holds now plus
90% of what the machine has available (``MemAvailable``; the rest is headroom for
the prediction's error). Chunk sizes are tried from
the model's own (unchunked first when it runs unchunked) down to the smallest;
the first whose predicted peak fits is used for this sequence only.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional

from torch import nn

from ptq_protein.errors import InputError
from ptq_protein.models.fold_memory import CHUNK_CHOICES, FoldPlan, choose_plan, dims_of, predict_peak
from ptq_protein.workflows.memory_budget import DEFAULT_SHARE, process_budget  # noqa: F401 (re-exported)

__all__ = ["FoldRefused", "planned_fold", "fold_budget", "longest_fitting"]

log = logging.getLogger(__name__)

_GIB = 2 ** 30


class FoldRefused(InputError):
    """A sequence whose fold would not fit in the memory budget: the message has the estimate and what would fit."""


def fold_budget(max_memory: Optional[int] = None) -> Optional[int]:
    """Bytes the fold's process may use (:func:`~ptq_protein.workflows.memory_budget.process_budget`)."""
    return process_budget(max_memory)


@contextlib.contextmanager
def planned_fold(model: nn.Module, length: int, max_memory: Optional[int] = None) -> Iterator[Optional[FoldPlan]]:
    """Run a fold of ``length`` residues under the plan that fits (the trunk's chunk size set meanwhile).

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
    plan = choose_plan(dims, length, budget, pair_bits=bits, chunks=chunks)
    if plan is None:
        raise FoldRefused(_refusal(model, length, budget, bits, min(c for c in chunks if c is not None)))
    if plan.chunk != own:
        log.warning("%d residues: predicted peak %.1f GiB within the %.1f GiB budget with %s (the model's: %s)",
                    length, predict_peak(dims, plan) / _GIB, budget / _GIB, plan.describe(),
                    "unchunked" if own is None else own)
    trunk.set_chunk_size(plan.chunk)
    try:
        yield plan
    finally:
        trunk.set_chunk_size(own)


def longest_fitting(model: nn.Module, budget: int, pair_bits: Optional[int], chunk: int) -> int:
    """The longest length (residues) whose predicted peak at ``chunk`` is within ``budget`` bytes (0: none)."""
    dims = dims_of(model)
    low, high = 0, 1
    while predict_peak(dims, FoldPlan(high, 1, chunk, pair_bits)) <= budget and high < 1 << 20:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if predict_peak(dims, FoldPlan(mid, 1, chunk, pair_bits)) <= budget else (low, mid)
    return low


def _refusal(model: nn.Module, length: int, budget: int, bits: Optional[int], smallest: int) -> str:
    need = predict_peak(dims_of(model), FoldPlan(length, 1, smallest, bits))
    text = (f"{length} residues need ~{need / _GIB:.1f} GiB even at chunk size {smallest}"
            f"{'' if bits is None else f' with int{bits} pair activations'}, over the {budget / _GIB:.1f} GiB "
            f"budget; up to {longest_fitting(model, budget, bits, smallest)} residues fit")
    if bits is None:
        text += f" (with --pair-bits 8: up to {longest_fitting(model, budget, 8, smallest)})"
    return text + "; raise --max-memory or use a machine with more memory"
