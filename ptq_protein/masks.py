"""Align a batch's residue masks to an activation's shape, whatever its layout.

Calibration must ignore padding and BOS/EOS/CLS positions (and, for pair
tensors, every pair that involves one). Activations arrive as (B, T, C),
(T, B, C), (B, L, L, C), (B*H, T, T) ... so the mask is built per dimension:
the batch dimension is the first one of size B (or B*k for heads folded into
the batch), every other dimension of size T (LM tokens) or L (residues) is a
sequence dimension, and the valid set is the AND over those dimensions.
The calibration loop keeps B distinct from T and L so this is unambiguous.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["align_mask"]


def _seq_mask(size: int, token_mask: torch.Tensor, residue_mask: torch.Tensor) -> Optional[torch.Tensor]:
    if size == token_mask.shape[1]:
        return token_mask
    if size == residue_mask.shape[1]:
        return residue_mask
    return None


def _batch_dim(dims: Sequence[int], batch: int, seq_sizes: set) -> Optional[tuple]:
    """(dim index, repeat factor) of the batch dimension, or None."""
    for i, size in enumerate(dims[:2]):
        if size == batch and (i == 0 or dims[0] in seq_sizes):
            return i, 1
    if dims and dims[0] % batch == 0 and dims[0] not in seq_sizes:
        return 0, dims[0] // batch  # heads folded into the batch, batch-major (b * H + h)
    return None


def align_mask(shape: Sequence[int], token_mask: torch.Tensor, residue_mask: torch.Tensor,
               channel_last: bool = True) -> Optional[torch.Tensor]:
    """Boolean mask of valid positions for an activation of ``shape``.

    Parameters
    ----------
    shape : activation shape, e.g. (B, T, C) or (T, B, C) or (B, L, L, C).
    token_mask : [B, T] bool, True at LM positions that hold a residue.
    residue_mask : [B, L] bool, True at real residues.
    channel_last : the last dimension is features (never masked).

    Returns
    -------
    A bool tensor broadcastable to ``shape`` (the masked dimensions at full size,
    the others 1), or None when no layout matches (the caller then keeps all values).
    """
    dims = list(shape[:-1] if channel_last else shape)
    batch = token_mask.shape[0]
    seq_sizes = {token_mask.shape[1], residue_mask.shape[1]}
    if len(dims) == 1 and dims[0] == token_mask.numel():  # (B*T, C): flattened batch-first tokens
        return token_mask.reshape(-1, *([1] if channel_last else []))
    found = _batch_dim(dims, batch, seq_sizes)
    if found is None:
        return None
    bdim, repeat = found
    mask = torch.ones([1] * len(shape), dtype=torch.bool, device=token_mask.device)
    used_seq = False
    for i, size in enumerate(dims):
        if i == bdim:
            continue
        seq = _seq_mask(size, token_mask, residue_mask)
        if seq is None:
            continue
        used_seq = True
        if repeat > 1:
            seq = seq.repeat_interleave(repeat, dim=0)
        view = [1] * len(shape)
        view[bdim] = seq.shape[0]
        view[i] = seq.shape[1]
        if bdim > i:  # (T, B, ...) layout: the sequence dimension comes first
            part = seq.t().reshape(view)
        else:
            part = seq.reshape(view)
        mask = mask & part.to(mask.device)
    if not used_seq:
        return None
    return mask
