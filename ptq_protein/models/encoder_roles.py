"""The modules of a pre-LayerNorm transformer layer by role: what a fused layer executor needs to know of it.

Architecture code (fair-esm's ``TransformerLayer`` in :mod:`ptq_protein.models.fused_float`, transformers'
``EsmLayer`` in :mod:`ptq_protein.models.hf_fused`) names the roles; the integer executor
(:mod:`ptq_protein.nn.layer_int8`) runs them without knowing either class. The executor is offered by the
quantized linears themselves (``QuantLinear.encoder_layer_runner``), since this layer of the package does not
import the quantized modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from torch import nn

__all__ = ["EncoderLayer", "layer_runner"]


@dataclass(frozen=True)
class EncoderLayer:
    """One pre-LayerNorm layer: ``x += out(attn(q, k, v)(attn_norm(x)))``, ``x += fc2(gelu(fc1(ffn_norm(x))))``.

    ``attn_norm`` / ``ffn_norm``: a LayerNorm (or a quantizer wrapper around one); ``q_scaling`` multiplies q
    before rotary (ESM's order); attention takes rotary on q and k and no further scale.
    """

    attn_norm: nn.Module
    q: nn.Module
    k: nn.Module
    v: nn.Module
    out: nn.Module
    ffn_norm: nn.Module
    fc1: nn.Module
    fc2: nn.Module
    heads: int
    q_scaling: float

    @property
    def linears(self) -> Tuple[nn.Module, ...]:
        return self.q, self.k, self.v, self.out, self.fc1, self.fc2


def layer_runner(layer: EncoderLayer) -> Optional[object]:
    """The fused executor the layer's linears offer (a module with ``blocker`` and ``forward``), or None."""
    offer = getattr(layer.fc1, "encoder_layer_runner", None)
    return None if offer is None else offer()
