"""Online Hadamard rotation of ESM C's SwiGLU product (QuaRot, Ashkboos et al. 2024), before the down projection.

The product ``silu(a) * b`` that ``ffn.3`` reads is heavy-tailed (kurtosis 25-27 on a random 12 x 384 ESM C),
so one 8-bit scale per token is set by a few channels. Each block's SwiGLU is told to multiply its product by a
block-diagonal Hadamard matrix ``H`` (:mod:`ptq_protein.quant.hadamard`) at run time, and ``ffn.3``'s weight
``W`` becomes ``W H``: the float model computes the same function (``H`` is symmetric and orthonormal), while
the rotated product spreads each outlier over ``block`` channels. ESM-2's ``fc2`` reads a GELU inside fair-esm's
or transformers' own layer classes, with no module of ours to rotate online, so only families whose adapter
names :attr:`~ptq_protein.models.adapter_base.ModelAdapter.rotation_pairs` (ESM C) can be rotated.
"""

from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import torch
from torch import nn

from ptq_protein.models.adapters import ModelAdapter, get_adapter
from ptq_protein.quant.hadamard import block_hadamard, check_hadamard_block
from ptq_protein.support.errors import InputError

__all__ = ["rotate_ffn_product_", "rotation_sites"]

log = logging.getLogger(__name__)


def rotation_sites(model: nn.Module, block: int, adapter: Optional[ModelAdapter] = None) -> List[Tuple[str, str]]:
    """``[(SwiGLU name, Linear name)]`` that :func:`rotate_ffn_product_` would rotate; refuses, in one line, a
    block that is no power of two or does not divide a product's width, and a model with nowhere to rotate."""
    check_hadamard_block(block, "rotate_ffn")
    adapter = get_adapter(model) if adapter is None else adapter
    sites = adapter.rotation_sites(model)
    if not sites:
        raise InputError(f"rotate_ffn applies to ESM C only (an online Hadamard on its SwiGLU product), not to this "
                         f"{adapter.family} model ({type(model).__name__}), which has no module of ours before its "
                         "FFN output Linear: use a recipe without rotate_ffn (e.g. w8a8-dynamic)")
    for op, linear in sites:
        width = model.get_submodule(linear).in_features
        if width % block:
            raise InputError(f"rotate_ffn={block} does not divide the {width} channels of the SwiGLU product that "
                             f"{linear} reads; use a power of two that divides {width} (e.g. 128)")
        done = model.get_submodule(op).rotation
        if done not in (0, block):
            raise InputError(f"{op} is already rotated with block {done}, not {block}: quantize the unrotated "
                             f"model, or ask for rotate_ffn={done}")
    return sites


@torch.no_grad()
def rotate_ffn_product_(model: nn.Module, block: int, adapter: Optional[ModelAdapter] = None) -> List[str]:
    """Rotate every SwiGLU product of ``model`` (in place) by block-``block`` Hadamard matrices; returns the
    Linears whose weights became ``W H``.

    ``W H`` is computed in float64 and stored in the weight's dtype. A block already rotated with ``block``
    is left as it is (rotating twice would undo the weight's rotation but not the product's).
    """
    rotated = []
    for op, linear in rotation_sites(model, block, adapter):
        glu, down = model.get_submodule(op), model.get_submodule(linear)
        if glu.rotation == block:
            continue
        glu.rotation = block
        down.weight.copy_(block_hadamard(down.weight.double(), block).to(down.weight.dtype))
        rotated.append(linear)
    log.info("rotated the SwiGLU product of %d blocks (Hadamard block %d)", len(rotated), block)
    return rotated
