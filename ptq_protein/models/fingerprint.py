"""A cheap, deterministic identity of a model's weights, for refusing to resume a run made by another model.

Hashing every byte of a 3B-parameter model costs tens of seconds; this reads each
tensor once in float64 (its sum and sum of squares) plus its first and last few
values, which tells apart two seeds, two checkpoints or two architectures while
costing one pass over the weights. It is an identity check for resumed runs, not
a cryptographic digest.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

__all__ = ["model_fingerprint"]

_EDGE = 8  # values read from each end of every tensor


@torch.no_grad()
def model_fingerprint(model: nn.Module) -> str:
    """sha256 over (class, and per parameter/buffer: name, shape, dtype, float64 sums, edge values)."""
    digest = hashlib.sha256(type(model).__name__.encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        if flat.numel() and (flat.dtype.is_floating_point or not flat.dtype.is_complex):
            wide = flat.to(torch.float64)
            edges = torch.cat([wide[:_EDGE], wide[-_EDGE:]])
            digest.update(repr([float(wide.sum()), float((wide * wide).sum()), *edges.tolist()]).encode())
    return digest.hexdigest()
