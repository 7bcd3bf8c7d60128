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

from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ["align_mask", "valid_boxes", "special_positions"]


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


def _layout(shape: Sequence[int], token_mask: torch.Tensor, residue_mask: torch.Tensor,
            channel_last: bool) -> Optional[tuple]:
    """``(batch dim, repeat, [(dim, seq mask [B, size])])``, or None when no layout matches.

    ``repeat`` > 1 when heads are folded into the batch dimension (``b * repeat + h``).
    """
    dims = list(shape[:-1] if channel_last else shape)
    batch = token_mask.shape[0]
    seq_sizes = {token_mask.shape[1], residue_mask.shape[1]}
    found = _batch_dim(dims, batch, seq_sizes)
    if found is None:
        return None
    bdim, repeat = found
    seqs = []
    for i, size in enumerate(dims):
        seq = None if i == bdim else _seq_mask(size, token_mask, residue_mask)
        if seq is not None:
            seqs.append((i, seq))
    return (bdim, repeat, seqs) if seqs else None


def _flat_tokens(shape: Sequence[int], token_mask: torch.Tensor, channel_last: bool) -> bool:
    """(B*T, C): batch-first tokens flattened into one dimension."""
    dims = list(shape[:-1] if channel_last else shape)
    return len(dims) == 1 and dims[0] == token_mask.numel()


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
    if _flat_tokens(shape, token_mask, channel_last):
        return token_mask.reshape(-1, *([1] if channel_last else []))
    layout = _layout(shape, token_mask, residue_mask, channel_last)
    if layout is None:
        return None
    bdim, repeat, seqs = layout
    mask = torch.ones([1] * len(shape), dtype=torch.bool, device=token_mask.device)
    for i, seq in seqs:
        seq = seq.repeat_interleave(repeat, dim=0) if repeat > 1 else seq
        view = [1] * len(shape)
        view[bdim] = seq.shape[0]
        view[i] = seq.shape[1]
        part = seq.t().reshape(view) if bdim > i else seq.reshape(view)  # (T, B, ...): sequence dim first
        mask = mask & part.to(mask.device)
    return mask


def _runs(mask: torch.Tensor) -> Optional[List[Tuple[int, int]]]:
    """``[(start, stop)]`` of each row's True run of a [N, n] bool mask; None if a row has two runs."""
    counts = mask.sum(1)
    first = mask.int().argmax(1)  # the first True (0 for an empty row)
    pos = torch.arange(mask.shape[1], device=mask.device)
    one_run = (pos >= first[:, None]) & (pos < (first + counts)[:, None])
    if not torch.equal(one_run, mask):
        return None
    return list(zip(first.tolist(), (first + counts).tolist()))


def valid_boxes(shape: Sequence[int], token_mask: torch.Tensor, residue_mask: torch.Tensor,
                channel_last: bool = True) -> Optional[List[Tuple[slice, ...]]]:
    """The valid positions of ``shape`` as one box of slices per sequence, or None.

    Each sequence's residues form one run of positions, so its valid set in any
    layout is a box (a run in every sequence dimension): ``x[box]`` is a view,
    and statistics over the boxes equal those over ``x[align_mask(...)]``
    without copying the activation. None when no layout matches or a mask row
    is not one run (use :func:`align_mask` then). Empty sequences get no box.
    """
    if _flat_tokens(shape, token_mask, channel_last):
        runs = _runs(token_mask)
        if runs is None:
            return None
        t = token_mask.shape[1]
        return [(slice(b * t + s, b * t + e),) for b, (s, e) in enumerate(runs) if e > s]
    layout = _layout(shape, token_mask, residue_mask, channel_last)
    if layout is None:
        return None
    bdim, repeat, seqs = layout
    runs = {i: _runs(seq) for i, seq in seqs}
    if any(r is None for r in runs.values()):
        return None
    boxes = []
    for b in range(token_mask.shape[0]):
        box = [slice(None)] * len(shape)
        box[bdim] = slice(b * repeat, (b + 1) * repeat)
        for i, r in runs.items():
            box[i] = slice(*r[b])
        if all(runs[i][b][1] > runs[i][b][0] for i in runs):
            boxes.append(tuple(box))
    return boxes


def special_positions(shape: Sequence[int], computed: torch.Tensor, special: torch.Tensor,
                      channel_last: bool = True) -> Optional[torch.Tensor]:
    """Positions of ``shape`` that involve a BOS/EOS token, or None when there are none.

    ``computed`` [B, T]: tokens the model computes (not padding); ``special``
    [B, T]: BOS/EOS among them. A position counts when none of its sequence
    indices is padding and at least one is special (for a pair tensor or an
    attention map: every row and column of a special token). Tensors without a
    token dimension (ESMFold's residue-indexed trunk) have none.
    """
    every = align_mask(shape, computed, computed, channel_last)
    if every is None:
        return None
    residues = computed & ~special
    found = every & ~align_mask(shape, residues, residues, channel_last)
    return found if bool(found.any()) else None
