"""Linear-input statistics for GPTQ: the order sites run in, and one site's input Hessian.

Both run calibration batches through the model with forward pre-hooks
(removed in ``finally``). The Hessian keeps only residue positions, like every
other calibration statistic (masks from :mod:`ptq_protein.calibration.masks`),
and holds one ``[K, K]`` float64 sum at a time. Once the site has seen its
input, the rest of the forward is skipped: later layers cannot change it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ptq_protein.calibration.block_replay import BlockReplay, block_of, block_plan, call_order
from ptq_protein.calibration.masks import align_mask, valid_boxes
from ptq_protein.models.adapters import Batch, ModelAdapter

__all__ = ["linear_call_groups", "input_hessian", "block_replay", "valid_rows"]

log = logging.getLogger(__name__)


class _SiteDone(Exception):
    """Raised by a hook to stop a forward once the site it waits for has run."""


def valid_rows(x: torch.Tensor, batch: Batch, special: bool = False) -> torch.Tensor:
    """``[n, C]`` float64: the rows of ``x`` [..., C] at residue positions of ``batch`` (all rows if unalignable);
    ``special``: at the BOS/EOS positions too (never padding)."""
    x = x.detach()
    tm, rm = batch.token_mask.to(x.device), batch.residue_mask.to(x.device)
    if special and batch.special_mask is not None:
        tm = tm | batch.special_mask.to(x.device)
    boxes = valid_boxes(x.shape, tm, rm, channel_last=True)
    if boxes is not None:
        parts = [x[box].reshape(-1, x.shape[-1]) for box in boxes]
        return torch.cat(parts).double() if parts else x.new_zeros((0, x.shape[-1]), dtype=torch.float64)
    mask = align_mask(x.shape, tm, rm, channel_last=True)
    if mask is None:
        log.warning("could not align the residue mask with an input of shape %s: its Hessian includes every "
                    "position", tuple(x.shape))
        return x.reshape(-1, x.shape[-1]).double()
    return x[mask.expand(*x.shape[:-1], 1).squeeze(-1)].double()


@contextlib.contextmanager
def _pre_hooks(model: nn.Module, hooks: Dict[str, object]) -> Iterator[None]:
    handles = []
    try:
        for name, hook in hooks.items():
            handles.append(model.get_submodule(name).register_forward_pre_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _run(model: nn.Module, adapter: ModelAdapter, batch: Batch, forward_kwargs: dict) -> None:
    with torch.no_grad(), adapter.calibration_mode(model):
        try:
            adapter.forward(model, batch, **forward_kwargs)
        except _SiteDone:
            pass


def linear_call_groups(model: nn.Module, adapter: ModelAdapter, names: Sequence[str], batch: Batch,
                       forward_kwargs: Optional[dict] = None) -> List[Tuple[str, ...]]:
    """Sites in the order of their first call on ``batch``, sites fed the very same tensor grouped.

    The q/k/v projections of one attention read one tensor: they share one
    Hessian. Sites that never run are left out (the caller decides what to do).
    """
    order: List[str] = []
    same_input: Dict[str, bool] = {}
    last: List[Optional[torch.Tensor]] = [None]

    def make(name):
        def hook(module, args):
            if name not in same_input and args and torch.is_tensor(args[0]):
                same_input[name] = args[0] is last[0]
                order.append(name)
                last[0] = args[0]
        return hook

    try:
        with _pre_hooks(model, {n: make(n) for n in names}):
            _run(model, adapter, batch, forward_kwargs or {})
    finally:
        last[0] = None
    groups: List[List[str]] = []
    for name in order:
        if same_input[name] and groups:
            groups[-1].append(name)
        else:
            groups.append([name])
    return [tuple(g) for g in groups]


def input_hessian(model: nn.Module, adapter: ModelAdapter, name: str, batches: Sequence[Batch],
                  forward_kwargs: Optional[dict] = None, replay: Optional[BlockReplay] = None,
                  special: bool = False) -> Tuple[Optional[torch.Tensor], int]:
    """``(sum of x x^T over residue rows [K, K] float64, rows)`` of site ``name``'s first input per batch
    (``special``: the BOS/EOS rows too).

    None when the site never saw a residue. Each forward stops once the site has run; with ``replay``, the
    finished blocks before it return their stored outputs instead of running.
    """
    acc: List[Optional[torch.Tensor]] = [None]
    rows = [0]
    state: Dict[str, Batch] = {}

    def hook(module, args):
        x = valid_rows(args[0], state["batch"], special)
        if x.numel():
            if not bool(torch.isfinite(x).all()):
                raise ValueError(f"NaN/Inf in the input of {name} during GPTQ calibration: the model produces "
                                 "non-finite values on these sequences")
            gram = x.T @ x
            acc[0] = gram if acc[0] is None else acc[0] + gram
            rows[0] += x.shape[0]
        raise _SiteDone

    with _pre_hooks(model, {name: hook}), replay.active() if replay else contextlib.nullcontext():
        for i, batch in enumerate(batches):
            state["batch"] = batch
            if replay is not None:
                replay.batch = i
            _run(model, adapter, batch, forward_kwargs or {})
    return acc[0], rows[0]


def block_replay(model: nn.Module, adapter: ModelAdapter, groups: Sequence[Sequence[str]], batch: Batch,
                 forward_kwargs: Optional[dict] = None) -> Optional[BlockReplay]:
    """A :class:`~ptq_protein.calibration.block_replay.BlockReplay` for ``groups`` when one forward of
    ``batch`` shows it sound (:func:`~ptq_protein.calibration.block_replay.block_plan`), else None."""
    first = block_of(groups[0][0]) if groups else None
    if first is None:
        return None
    with call_order(model, first[0]) as calls:
        _run(model, adapter, batch, forward_kwargs or {})
    plan = block_plan(groups, calls)
    return BlockReplay(model, plan) if plan is not None else None
