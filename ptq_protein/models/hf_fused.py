"""transformers' ``EsmLayer`` on the fused integer executor, when its linears run integer GEMMs.

The counterpart of :mod:`ptq_protein.models.fused_float` for transformers' ESM-2 (``EsmModel``,
``EsmForMaskedLM``, the task heads, and ESMFold's language-model stem): each ``EsmLayer`` of a model gets a
subclass (same name, same parameters, hooks kept) whose forward hands the whole layer to
:mod:`ptq_protein.nn.layer_int8` when that runs here (an integer model on CPU, no attention weights asked
for), and runs transformers' own forward otherwise. Float models and the fake backend never take it.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from ptq_protein.models.encoder_roles import EncoderLayer, layer_runner

__all__ = ["use_fused_layers_"]

_FUSED: dict = {}


def use_fused_layers_(model: nn.Module) -> int:
    """Give every transformers ``EsmLayer`` of ``model`` the fused forward (in place); how many have it."""
    try:
        from transformers.models.esm.modeling_esm import EsmLayer
    except ImportError:
        return 0
    count = 0
    for module in model.modules():
        if type(module) is EsmLayer:
            module.__class__ = _fused_class(EsmLayer)
        count += isinstance(module, EsmLayer)
    return count


def __getattr__(name: str) -> type:
    """The fused class by name (``EsmLayer``), so pickle finds it."""
    if name == "EsmLayer":
        from transformers.models.esm.modeling_esm import EsmLayer

        return _fused_class(EsmLayer)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fused_class(base: type) -> type:
    if base not in _FUSED:
        _FUSED[base] = type(base.__name__, (base,), {"forward": _forward, "__module__": __name__,
                                                     "__doc__": _forward.__doc__})
    return _FUSED[base]


def _forward(self, hidden_states: Tensor, *args: Any, **kwargs: Any):
    """transformers' ``EsmLayer.forward``, the whole layer on the fused integer executor where it runs."""
    out = _int8_layer(self, hidden_states, *_fast_call(args, kwargs))
    return super(type(self), self).forward(hidden_states, *args, **kwargs) if out is None else out


_NOT_FUSED = ("encoder_hidden_states", "encoder_attention_mask", "head_mask", "past_key_value", "past_key_values",
              "output_attentions")  # call arguments the fused layer does not take: set, the modules run


def _fast_call(args: tuple, kwargs: dict) -> tuple:
    """(attention mask, rotary tables) of a transformers 5 layer call the fused layer can run, else (None, None).

    transformers 5 passes the mask and ``position_embeddings`` (cos, sin) by keyword; a call with cross-attention,
    head masks, a cache or attention weights asked for (or transformers 4's positional signature) is not one.
    """
    rotary = kwargs.get("position_embeddings")
    if args or rotary is None or any(kwargs.get(k) not in (None, False) for k in _NOT_FUSED):
        return None, None
    return kwargs.get("attention_mask"), rotary


def _roles(layer: nn.Module) -> EncoderLayer:
    attn = layer.attention.self
    return EncoderLayer(layer.attention.LayerNorm, attn.query, attn.key, attn.value, layer.attention.output.dense,
                        layer.LayerNorm, layer.intermediate.dense, layer.output.dense, attn.num_attention_heads,
                        attn.attention_head_size ** -0.5)


def _int8_layer(layer: nn.Module, x: Tensor, mask: Optional[Tensor], rotary: Optional[tuple]) -> Optional[Tensor]:
    """The layer's output from ``nn.layer_int8`` (x ``[B, T, C]``), or None where it does not run here."""
    attn = layer.attention.self
    if (layer.training or rotary is None or getattr(attn, "position_embedding_type", None) != "rotary"
            or layer.is_decoder or _attention_maps_recorded() or torch._C._is_torch_function_mode_enabled()):
        return None
    roles = _roles(layer)
    runner = layer_runner(roles)
    if runner is None or runner.blocker(roles, x) is not None:
        return None
    cos, sin = (t.reshape(t.shape[0], t.shape[1], 1, t.shape[-1]) for t in rotary)  # [B or 1, T, D]
    if mask is not None and mask.dtype not in (torch.bool, x.dtype):
        return None
    return runner.forward(roles, x, batch_first=True, cos=cos.float(), sin=sin.float(), attn_mask=mask)


def _attention_maps_recorded() -> bool:
    """Whether the running forward collects attention weights (transformers 5 records them with hooks on the
    attention modules, which the fused layer would not call)."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # transformers 4 passes output_attentions to each layer instead
        return False
    collected = _active_collector.get()
    return collected is not None and "attentions" in collected
