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
from typing import Dict, Iterable, Tuple

import torch
from torch import nn

from ptq_protein.quant.study import study_pwlq, study_signed_range, study_uniform, study_weight_rows
from ptq_protein.recipes.config import Scheme, StudyOptions

__all__ = ["StudyActQuant", "study_weights_", "study_weight_keys", "cast_owners_float32_"]

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
    """Names of the tensors their W8 rounds: floating tensors under ``options.weight_prefixes``.

    Rotary ``inv_freq`` buffers are left out unless ``options.round_rotary``; then
    every one of them is rounded wherever the library keeps it (transformers 4.x:
    one per layer under ``esm.encoder.layer``, inside their prefixes; 5.x: one
    shared ``esm.rotary_embeddings.inv_freq``, outside them; identical values, so
    rounding the shared one is rounding each copy), persistent or not.
    """
    state = model.state_dict(keep_vars=True)  # their W8 walked the state dict's keys (quant_weis.py:36-39)
    for key, value in _tensors(model).items():
        if not value.is_floating_point() or value.numel() == 0:
            continue
        if _is_rotary(key):
            if options.round_rotary:
                yield key
        elif key in state and key.startswith(options.weight_prefixes):
            yield key


@torch.no_grad()
def study_weights_(model: nn.Module, options: StudyOptions, bits: int = 8) -> Dict[str, str]:
    """Round ``model``'s tensors in place with their W8 (``quant_weis.py:8-51``); returns {key: how}.

    Per row for >= 2-dim tensors, per tensor for 1-dim ones (biases, LayerNorm
    parameters and, when activation quantizers are attached, their range buffers).
    With ``options.cast_float32`` the half-precision top-level modules holding
    those tensors become float32 first (:func:`cast_owners_float32_`).
    Modifies ``model``: callers pass their own copy.
    """
    keys = list(study_weight_keys(model, options))
    if options.cast_float32:
        cast_owners_float32_(model, keys)
    tensors = _tensors(model)
    done: Dict[str, str] = {}
    for key in keys:
        tensor = tensors[key]
        tensor.data.copy_(study_weight_rows(tensor.data, bits))
        done[key] = "per row" if tensor.dim() > 1 else "per tensor"
    if not done:
        log.warning("study W8: no tensor under %s in this model; nothing was rounded", list(options.weight_prefixes))
    return done


def cast_owners_float32_(model: nn.Module, keys: Iterable[str]) -> Tuple[str, ...]:
    """Cast each top-level module owning one of ``keys`` to float32 if it holds a 16-bit float tensor.

    Their W8 scripts cast ESMFold's ESM-2 stem, which transformers loads in float16,
    before rounding (``quant_weis.py:29``, ``model.esm = model.esm.float()``), and ran
    it in float32 afterwards. The whole module is cast, so it stays one dtype inside
    (ESMFold casts the stem's output to the trunk's dtype). Returns the owners cast.
    """
    cast = []
    for owner in dict.fromkeys(k.split(".", 1)[0] if "." in k else "" for k in keys):
        module = model.get_submodule(owner)
        if any(t.dtype in (torch.float16, torch.bfloat16) for t in _tensors(module).values()):
            module.float()
            cast.append(owner or "<model>")
    if cast:
        log.info("study W8: cast %s to float32 before rounding, as the study did", ", ".join(cast))
    return tuple(cast)


def _is_rotary(key: str) -> bool:
    return key.rsplit(".", 1)[-1] == _ROTARY_KEY


def _tensors(module: nn.Module) -> Dict[str, torch.Tensor]:
    """State-dict tensors plus non-persistent buffers (a rotary ``inv_freq`` may be either), by name."""
    tensors = dict(module.state_dict(keep_vars=True))
    for name, buffer in module.named_buffers():
        tensors.setdefault(name, buffer)
    return tensors
