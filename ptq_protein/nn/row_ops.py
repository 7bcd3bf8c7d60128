"""Row operations of the quantized modules: special-token rows kept exact, per-row parameters sliced."""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["restore_rows", "row_slice"]


def restore_rows(x: torch.Tensor, out: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``where(keep, x, out)``; a per-row mask (``[..., 1]``) copies those few rows into ``out`` in place.

    ``out`` is the quantizer's fresh output; a full-size ``where`` would be one
    more pass over the activation to change two rows per sequence.
    """
    if keep.shape[-1] != 1 or keep.shape[:-1] != x.shape[:-1] or not out.is_contiguous() or out.shape != x.shape:
        return torch.where(keep, x, out)
    index = keep.reshape(-1).nonzero().flatten()
    flat = out.view(-1, out.shape[-1])
    flat.index_copy_(0, index, x.reshape(-1, x.shape[-1]).index_select(0, index).to(out.dtype))
    return out


def row_slice(t: Optional[torch.Tensor], start: int, stop: int) -> Optional[torch.Tensor]:
    """Rows ``start:stop`` of a per-row parameter; a per-tensor one (0-d or one row) as it is."""
    if t is None or t.dim() == 0 or t.shape[0] == 1:
        return t
    return t[start:stop]
