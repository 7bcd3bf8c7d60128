"""An ESM-2 artifact (or ESM C, or ESMFold's ESM-2 stem) as a traceable module with swappable quantized sites.

What the exporters share, so each keeps only what its runtime needs: :mod:`ptq_protein.interop.onnx_export`
swaps in ONNX QDQ sites and traces with ``torch.onnx.export``; :mod:`ptq_protein.interop.openvino_engine` swaps
in OpenVINO's sites and traces with ``openvino.convert_model``. Either way::

    wrapper = exportable(model, hidden_states)            # (input_ids, attention_mask) -> outputs
    swap_sites(wrapper.exported, wrapper.rows, Linear, Act)  # the runtime's form of each quantized site
    ids = example_ids()
    with tracing(wrapper), torch.no_grad():
        ...trace wrapper on (ids, (ids != PAD_ID).long())...

The wrapper takes ``input_ids`` and ``attention_mask``, both int64 ``[batch, length]``, and returns its
:attr:`Exportable.outputs` in order: ``logits`` (masked LMs), ``last_hidden_state`` ``[batch, length, channels]``
and, with ``hidden_states``, ``hidden_states`` ``[batch, length, layers + 1, channels]``. BOS/EOS rows are read
from the ids (a tracer records the model's own embedding hooks as constants, so :func:`tracing` sets them aside).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional, Tuple

import torch
from torch import nn

from ptq_protein.interop.onnx_qdq import SpecialRows
from ptq_protein.models.lm_outputs import lm_info
from ptq_protein.nn.modules import ActQuantizer, QuantInput, QuantLinear
from ptq_protein.nn.special_tokens import SpecialTokenContext
from ptq_protein.support.errors import InputError

__all__ = ["PAD_ID", "Exportable", "exportable", "swap_sites", "tracing", "example_ids"]

PAD_ID = 1  # ESM-2's padding id (ESM C's too)
_EXAMPLE_LENGTHS = (7, 4)  # residues of the two traced sequences: a padded batch, batch != length
_KINDS = {"ESM2": "fair-esm", "EsmForMaskedLM": "masked-lm", "EsmModel": "base", "ESMC": "esmc"}


def exportable(model: nn.Module, hidden_states: bool) -> Exportable:
    """``model`` (or ESMFold's ESM-2 stem) wrapped for tracing; refused in one line for other models.

    ``hidden_states``: add every layer's output (always on for ESMFold's stem, what its trunk reads).
    """
    name = type(model).__name__
    if name in _KINDS:
        return Exportable(model, _KINDS[name], "", hidden_states)
    if name == "EsmForProteinFolding":
        return Exportable(model.esm, "stem", "esm.", hidden_states)
    raise InputError(f"ONNX export covers ESM-2 (fair-esm ESM2, EsmForMaskedLM, EsmModel), ESM C and ESMFold's ESM-2 "
                     f"stem, not {name}")


def swap_sites(model: nn.Module, rows: SpecialRows, linear: type, act: type) -> None:
    """Each quantized site of ``model``, in place (a model loaded for the export), as the runtime's form:
    ``linear(QuantLinear, rows)`` for a quantized linear, ``act(ActQuantizer, rows)`` for another quantized input."""
    from ptq_protein.calibration.sites import set_module

    for name, module in list(model.named_modules()):
        if isinstance(module, QuantLinear):
            set_module(model, name, linear(module, rows))
        elif isinstance(module, QuantInput):
            module.input_quant = act(module.input_quant, rows)


def example_ids(lengths: Tuple[int, ...] = _EXAMPLE_LENGTHS) -> torch.Tensor:
    """ESM token ids of a padded batch (BOS ... EOS, padding 1): what the exporters trace on, so fair-esm's
    padding branch is the one kept (it is also right without padding)."""
    ids = torch.ones(len(lengths), max(lengths) + 2, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    for row, n in enumerate(lengths):
        ids[row, 0], ids[row, n + 1] = 0, 2
        ids[row, 1:n + 1] = torch.randint(4, 24, (n,), generator=gen)
    return ids


@contextlib.contextmanager
def tracing(wrapper: Exportable) -> Iterator[None]:
    """Hooks that read token ids from the embedding (``torch.isin``) are set aside: the wrapper sets the ids."""
    saved: List[Tuple[dict, dict]] = []
    for module in wrapper.exported.modules():
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            ours = {k: h for k, h in hooks.items() if isinstance(getattr(h, "__self__", None), SpecialTokenContext)}
            for key in ours:
                del hooks[key]
            saved.append((hooks, ours))
    try:
        yield
    finally:
        for hooks, ours in saved:
            hooks.update(ours)
        wrapper.rows.mask = None


class Exportable(nn.Module):
    """``(input_ids, attention_mask) -> outputs`` around the model (or ESMFold's stem), BOS/EOS rows set from the
    ids. Build it with :func:`exportable`."""

    def __init__(self, model: nn.Module, kind: str, prefix: str, hidden_states: bool):
        super().__init__()
        self.exported, self.kind, self.prefix = model, kind, prefix
        self.hidden_states = hidden_states or kind == "stem"
        logits = ["logits"] if kind in ("fair-esm", "masked-lm", "esmc") else []
        self.outputs = logits + ["last_hidden_state"] + (["hidden_states"] if self.hidden_states else [])
        quants = [m for m in model.modules() if isinstance(m, ActQuantizer) and m.special_tokens is not None]
        self.context: Optional[SpecialTokenContext] = quants[0].special_tokens if quants else None
        self.rows = SpecialRows()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        input_ids = input_ids.masked_fill(attention_mask == 0, PAD_ID)
        if self.context is not None:  # BOS/EOS rows stay float: [B, T, 1], or [T, B, 1] in fair-esm's layers
            special = torch.zeros_like(input_ids, dtype=torch.bool)
            for idx in self.context.special_ids:
                special = special | (input_ids == idx)
            self.rows.mask = (special.t() if self.kind == "fair-esm" else special)[..., None]
        if self.kind in ("fair-esm", "esmc"):  # both take repr_layers and return a dict; ESM C's last is its norm
            last = lm_info(self.exported).last_layer
            out = self.exported(input_ids, repr_layers=range(last + 1) if self.hidden_states else [last])
            logits, layers = out["logits"], [out["representations"][i] for i in sorted(out["representations"])]
        else:
            trunk = self.exported.esm if self.kind == "masked-lm" else self.exported
            out = trunk(input_ids=input_ids, attention_mask=attention_mask.long(),
                        output_hidden_states=self.hidden_states)
            layers = list(out.hidden_states) if self.hidden_states else [out.last_hidden_state]
            logits = self.exported.lm_head(out.last_hidden_state) if self.kind == "masked-lm" else None
        found = ([logits] if logits is not None else []) + [layers[-1]]
        return tuple(found + ([torch.stack(layers, dim=2)] if self.hidden_states else []))
