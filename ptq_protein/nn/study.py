"""The study's quantized modules: its activation quantizer and its W8 pass over the state dict.

:class:`StudyActQuant` is the inference side of their ``QuantAct``
(``piecewise_quant/quant_acts.py:14-68``): two float32 ``[1]`` buffers ``minv``
and ``maxv`` (the calibrated bounds), the signed/unsigned rule applied on every
call, then their uniform or pwlq-3 quantizer. It wraps a module's input through
:class:`~ptq_protein.nn.modules.QuantInput`, as their ``nn.Sequential(quant_act,
module)`` did. :func:`study_weights_` is their ``quant_checkpoint`` (W8) over the
keys of the model's state dict, which includes those buffers.
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable

import torch
from torch import nn

from ptq_protein.config import Scheme, StudyOptions
from ptq_protein.quant.study import study_pwlq, study_signed_range, study_uniform, study_weight_rows

__all__ = ["StudyActQuant", "study_weights_", "study_weight_keys"]

log = logging.getLogger(__name__)

_ROTARY_KEY = "inv_freq"


class StudyActQuant(nn.Module):
    """The study's static activation quantizer: calibrated bounds, their rule and math on every call.

    ``scheme`` is ``Scheme.STUDY_UNIFORM`` or ``Scheme.STUDY_PWLQ`` (b-bit centre plus
    b-bit tail: b+1 bits per value). The output keeps ``x``'s dtype.
    """

    def __init__(self, scheme: Scheme, bits: int, minv: torch.Tensor, maxv: torch.Tensor):
        super().__init__()
        if scheme not in (Scheme.STUDY_UNIFORM, Scheme.STUDY_PWLQ):
            raise ValueError(f"StudyActQuant takes the study's schemes, not {scheme.value!r}")
        self.scheme, self.bits = Scheme(scheme), bits
        # float32 [1], as their buffers (quant_acts.py:29-31): W8 rounds them per tensor.
        self.register_buffer("minv", minv.detach().to(torch.float32).reshape(1).clone())
        self.register_buffer("maxv", maxv.detach().to(torch.float32).reshape(1).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        signed, m = study_signed_range(self.minv, self.maxv)
        fn = study_pwlq if self.scheme is Scheme.STUDY_PWLQ else study_uniform
        return fn(x, self.bits, signed, m).to(x.dtype)

    def extra_repr(self) -> str:
        per_value = self.bits + 1 if self.scheme is Scheme.STUDY_PWLQ else self.bits
        return (f"{self.scheme.value}, bits={self.bits} ({per_value} bits/value), "
                f"min={float(self.minv):.6g}, max={float(self.maxv):.6g}")


def study_weight_keys(model: nn.Module, options: StudyOptions) -> Iterable[str]:
    """State-dict keys their W8 rounds: floating tensors under ``options.weight_prefixes``.

    Rotary ``inv_freq`` buffers are left out unless ``options.round_rotary``.
    """
    for key, value in model.state_dict(keep_vars=True).items():
        if not key.startswith(options.weight_prefixes) or not value.is_floating_point() or value.numel() == 0:
            continue
        if key.endswith(_ROTARY_KEY) and not options.round_rotary:
            continue
        yield key


@torch.no_grad()
def study_weights_(model: nn.Module, options: StudyOptions, bits: int = 8) -> Dict[str, str]:
    """Round ``model``'s tensors in place with their W8 (``quant_weis.py:8-51``); returns {key: how}.

    Per row for >= 2-dim tensors, per tensor for 1-dim ones (biases, LayerNorm
    parameters and, when activation quantizers are attached, their range buffers).
    Modifies ``model``: callers pass their own copy.
    """
    tensors = model.state_dict(keep_vars=True)
    done: Dict[str, str] = {}
    for key in list(study_weight_keys(model, options)):
        tensor = tensors[key]
        tensor.data.copy_(study_weight_rows(tensor.data, bits))
        done[key] = "per row" if tensor.dim() > 1 else "per tensor"
    if not done:
        log.warning("study W8: no tensor under %s in this model; nothing was rounded", list(options.weight_prefixes))
    return done
