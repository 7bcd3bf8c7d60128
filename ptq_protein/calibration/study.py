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
from ptq_protein.models.adapters import ModelAdapter
from ptq_protein.quant.study_observer import StudyTopKObserver
from ptq_protein.support.errors import InputError
from ptq_protein.support.progress import progress as progress_of

__all__ = ["study_calibrate", "study_observers"]


@contextlib.contextmanager
def study_observers(model: nn.Module, sites: Sequence[Site], k: int,
                    calls: int) -> Iterator[Dict[str, StudyTopKObserver]]:
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


def study_calibrate(model: nn.Module, adapter: ModelAdapter, sites: Sequence[Site], sequences: Sequence[str],
                    k: int, calls: int, forward_kwargs: Optional[dict] = None,
                    progress: bool = False) -> Dict[str, StudyTopKObserver]:
    """Run ``sequences`` one at a time (batch 1, in the given order) and return each site's observer."""
    if not sequences:
        raise InputError("the calibration set is empty: give at least one sequence (e.g. casp14:50, as the study)")
    iterator = progress_of(sequences, "calibrating (study)", "sequences", show=progress)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), study_observers(model, sites, k, calls) as observers:
            for seq in iterator:
                adapter.forward(model, adapter.make_batch([seq]), **(forward_kwargs or {}))
    finally:
        model.train(was_training)
    return observers
