"""The study's calibration pass: one sequence per forward, whole tensors, the model as it runs.

Their calibration model (``structure_prediction/scripts/quant_acts.py:31-50``)
wraps every site with a statistics-only quantizer and calls the float model on
one unpadded sequence at a time, with its own runtime settings (chunk size,
recycles, an fp16 stem where the loader made one). Nothing is masked: BOS/EOS
are part of every ESM-stem tensor. Each site keeps the extremes of its first
``calls`` calls (:class:`~ptq_protein.quant.study_observer.StudyTopKObserver`).
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Optional, Sequence

import torch
from torch import nn

from ptq_protein.calibration.calibrate import _first_tensor
from ptq_protein.calibration.sites import Site
from ptq_protein.errors import InputError
from ptq_protein.models.adapters import ModelAdapter
from ptq_protein.quant.study_observer import StudyTopKObserver

__all__ = ["study_calibrate", "study_observers"]


@contextlib.contextmanager
def study_observers(model: nn.Module, sites: Sequence[Site], k: int, calls: int) -> Iterator[Dict[str, StudyTopKObserver]]:
    """Forward pre-hooks feeding each site's whole first input to its observer (removed on exit)."""
    modules = dict(model.named_modules())
    observers = {s.name: StudyTopKObserver(k, calls) for s in sites}
    handles = []
    try:
        for site in sites:
            handles.append(modules[site.name].register_forward_pre_hook(_hook(observers[site.name]), with_kwargs=True))
        yield observers
    finally:
        for handle in handles:
            handle.remove()


def _hook(observer: StudyTopKObserver):
    def hook(module, args, kwargs):
        x = _first_tensor(args, kwargs)
        if x is not None and x.is_floating_point():
            observer.update(x)
        return None

    return hook


class _StemOnly(Exception):
    """Raised after the stem of a forward whose other sites have all seen their calls."""


@contextlib.contextmanager
def _stop_after_stem(model: nn.Module, adapter: ModelAdapter, observers: Dict[str, StudyTopKObserver]) -> Iterator[None]:
    """Skip the rest of a forward once every site outside the adapter's stem has its ``calls`` calls.

    Exact: those observers ignore later calls, and the stem (ESMFold's LM) runs
    first and alone feeds the rest, so only the stem's sites still take values.
    ESMFold's trunk and structure sites fill up (recycles x blocks calls per
    sequence) long before the LM's (one call per sequence); the remaining
    sequences then run the LM only. A site that never runs keeps this off.
    """
    prefix = f"{adapter.stem}."
    rest = [obs for name, obs in observers.items() if not name.startswith(prefix)]
    stem = None if adapter.stem is None or not rest else model.get_submodule(adapter.stem)
    if stem is None:
        yield
        return

    def hook(module, args, output):
        if all(obs.count >= obs.calls for obs in rest):
            raise _StemOnly

    handle = stem.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def study_calibrate(model: nn.Module, adapter: ModelAdapter, sites: Sequence[Site], sequences: Sequence[str],
                    k: int, calls: int, forward_kwargs: Optional[dict] = None,
                    progress: bool = False) -> Dict[str, StudyTopKObserver]:
    """Run ``sequences`` one at a time (batch 1, in the given order) and return each site's observer.

    An observer's ``seen`` counts the calls made until the pass no longer needed
    them (see :func:`_stop_after_stem`), not every call of every forward.
    """
    if not sequences:
        raise InputError("the calibration set is empty: give at least one sequence (e.g. casp14:50, as the study)")
    iterator: Sequence[str] = sequences
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(sequences, desc="calibrating (study)", unit="seq")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), study_observers(model, sites, k, calls) as observers, \
                _stop_after_stem(model, adapter, observers):
            for seq in iterator:
                try:
                    adapter.forward(model, adapter.make_batch([seq]), **(forward_kwargs or {}))
                except _StemOnly:
                    pass
    finally:
        model.train(was_training)
    return observers
