"""Calibration forwards, the one place they run: our statistics, the study's observers, or both in one set.

The callers decide what to collect from a :class:`~ptq_protein.passes.plan.CalibrationPlan`
(or several merged, in :mod:`ptq_protein.workflows.shared_calibration`); this
module only runs the forwards. Our statistics batch as the adapter says; the
study's observers alone run batch 1 (their pass), or ride our forwards when those
are exactly theirs (:func:`~ptq_protein.passes.plan.study_can_ride`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Optional, Sequence, Tuple

from torch import nn

from ptq_protein.calibration.calibrate import calibrate
from ptq_protein.calibration.sites import Site
from ptq_protein.calibration.study import study_calibrate, study_observers
from ptq_protein.passes.plan import StudyWatch
from ptq_protein.recipes.config import TensorQuant

__all__ = ["run_forwards"]


def run_forwards(model: nn.Module, adapter, seqs: Sequence[str], *, sites: Sequence[Site] = (),
                 specs: Optional[Dict[str, TensorQuant]] = None, include_special: bool = False,
                 study: Optional[StudyWatch] = None, batch_size: Optional[int] = None, progress: bool = False,
                 forward_kwargs: Optional[dict] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(our statistics at ``sites`` collected with ``specs``, the study's observers of ``study``).

    With both, the study's observers ride our forwards: the caller has checked they are the study's.
    """
    kwargs = forward_kwargs or {}
    if not sites:
        if study is None:
            return {}, {}
        return {}, study_calibrate(model, adapter, list(study.sites), seqs, study.keep, study.calls, kwargs, progress)
    riding = study_observers(model, list(study.sites), study.keep, study.calls) if study else contextlib.nullcontext()
    with riding as observers:
        stats = calibrate(model, adapter, list(sites), specs, seqs, batch_size=batch_size, progress=progress,
                          forward_kwargs=kwargs, include_special=include_special)
    return stats, observers or {}
