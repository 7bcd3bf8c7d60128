"""Weights read from a file are finite: one NaN or inf weight makes every output it reaches NaN, silently.

:func:`check_finite_weights` refuses such a model in one line naming the tensor, before any sequence runs
(``quantize`` refused it already, at calibration; ``embed`` and ``score`` wrote NaN with exit 0).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Optional

import torch
from torch import nn

from ptq_protein.support.errors import InputError

__all__ = ["check_finite_weights"]

_CHUNK = 1 << 22  # elements checked at a time: a bounded temporary, whatever the tensor's size


def check_finite_weights(model: nn.Module, where: str, after: Optional[Callable[[torch.Tensor], Any]] = None) -> None:
    """Raise :class:`InputError` naming the first floating-point parameter or buffer of ``model`` holding a
    NaN or an infinity (``where``: the file, for the message). ``after(tensor)`` runs once each tensor is
    checked (a mapped file hands its pages back there, so the check does not leave the file resident)."""
    for name, tensor in itertools.chain(model.named_parameters(), model.named_buffers()):
        finite = not tensor.is_floating_point() or tensor.is_meta or _all_finite(tensor.detach())
        if after is not None:
            after(tensor)
        if not finite:
            bad = int((~torch.isfinite(tensor.detach())).sum())
            raise InputError(f"{where}: weight {name} holds {bad} non-finite value{'s' if bad > 1 else ''} (NaN or "
                             "inf), which would make outputs NaN; the file is damaged or was saved from a diverged "
                             "run: re-download or re-export it")


def _all_finite(tensor: torch.Tensor) -> bool:
    flat = tensor.reshape(-1)
    return all(_chunk_finite(flat[i:i + _CHUNK]) for i in range(0, flat.numel(), _CHUNK))


def _chunk_finite(chunk: torch.Tensor) -> bool:
    """A NaN or infinity makes the sum non-finite, so a finite sum proves the chunk finite (one fast pass, no
    temporary); a non-finite sum may be finite values overflowing, so only then is each value tested."""
    return bool(torch.isfinite(chunk.sum())) or bool(torch.isfinite(chunk).all())
