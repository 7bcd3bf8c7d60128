"""Int8 pair activations for ESMFold: the trunk's L x L pair state held in int8, operated on by row chunks.

:func:`use_pair_int8` switches a transformers ``EsmForProteinFolding`` (float or
quantized) to it in place; :func:`pair_bits_of` says whether a model runs it.
"""

from __future__ import annotations

from typing import Optional

from torch import nn

from ptq_protein.nn.bound_forward import bind_forward
from ptq_protein.nn.pair_int8.holder import Int8Pair
from ptq_protein.nn.pair_int8.trunk import forward_pair_int8

__all__ = ["use_pair_int8", "pair_bits_of", "Int8Pair", "SUPPORTED_PAIR_BITS"]

SUPPORTED_PAIR_BITS = (8,)


def use_pair_int8(model: nn.Module, bits: Optional[int] = 8) -> nn.Module:
    """Run ``model``'s trunk with int8 pair activations (``bits=None``: back to float). Changes ``model`` in place."""
    if bits is not None and bits not in SUPPORTED_PAIR_BITS:
        raise ValueError(f"pair_bits={bits}: only {SUPPORTED_PAIR_BITS} or None (float pairs) are supported")
    trunk = getattr(model, "trunk", None)
    if trunk is None or not hasattr(trunk, "blocks") or not hasattr(model, "compute_language_model_representations"):
        raise ValueError(f"int8 pair activations need an ESMFold model (EsmForProteinFolding), got "
                         f"{type(model).__name__}")
    _check_modules(trunk)
    bind_forward(model, forward_pair_int8 if bits is not None else None)
    model.pair_bits = bits
    return model


def pair_bits_of(model: nn.Module) -> Optional[int]:
    """The pair activation bits ``model`` runs with (None: float pairs)."""
    return getattr(model, "pair_bits", None)


# The modules whose forward the int8 path re-runs by chunks from their parts: they must be transformers' own.
_REPLAYED = {"seq_attention": "EsmFoldSelfAttention", "tri_mul_out": "EsmFoldTriangleMultiplicativeUpdate",
             "tri_mul_in": "EsmFoldTriangleMultiplicativeUpdate", "sequence_to_pair": "EsmFoldSequenceToPair"}


def _check_modules(trunk: nn.Module) -> None:
    for i, block in enumerate(trunk.blocks):
        for name, kind in _REPLAYED.items():
            found = type(getattr(block, name)).__name__
            if found != kind:
                raise ValueError(f"int8 pair activations re-run trunk.blocks.{i}.{name} by chunks, but it is a "
                                 f"{found} (quantized matmul operands?); drop 'matmul' from the recipe's kinds "
                                 "or pair_bits")
