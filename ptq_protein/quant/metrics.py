"""Quantization error metrics (float64): mean squared error and SQNR."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Tuple

import torch

__all__ = ["quantization_mse", "sqnr_db", "sqnr_db_blocks", "BLOCK_VALUES"]

BLOCK_VALUES = 1 << 18  # values per float64 block in sqnr_db (2 MiB)


def quantization_mse(x: torch.Tensor, fake_fn: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """``mean((fake_fn(x) - x)^2)`` in float64, e.g. ``lambda t: pwlq_fake_quantize(t, cb)``."""
    xq = fake_fn(x)
    if xq.shape != x.shape:
        raise ValueError(f"fake_fn changed the shape {tuple(x.shape)} -> {tuple(xq.shape)}")
    return float(((xq.to(torch.float64) - x.to(torch.float64)) ** 2).mean())


def sqnr_db(x: torch.Tensor, xq: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(sum x^2 / sum (x - xq)^2)`` in dB.

    ``inf`` when ``xq == x`` exactly; ``-inf`` for an all-zero signal with error.
    """
    if xq.shape != x.shape:
        raise ValueError(f"shapes differ: x {tuple(x.shape)} vs xq {tuple(xq.shape)}")
    xf, qf = x.detach().reshape(-1), xq.detach().reshape(-1)
    return sqnr_db_blocks((xf[i:i + BLOCK_VALUES], qf[i:i + BLOCK_VALUES]) for i in range(0, xf.numel(), BLOCK_VALUES))


def sqnr_db_blocks(blocks: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> float:
    """:func:`sqnr_db` of a tensor given as ``(x block, xq block)`` pairs of equal shapes.

    Sums in float64 a block at a time: the swap measures every weight of the model,
    and whole-tensor float64 copies (5 GB of fresh pages at 650M) cost 2.5-5x the
    arithmetic; the sums agree with whole-tensor ones to ~1e-15.
    """
    signal = noise = 0.0
    for xb, qb in blocks:
        if xb.shape != qb.shape:
            raise ValueError(f"block shapes differ: x {tuple(xb.shape)} vs xq {tuple(qb.shape)}")
        a = xb.detach().reshape(-1).to(torch.float64)
        e = qb.detach().reshape(-1).to(torch.float64) - a
        signal += float(torch.dot(a, a))
        noise += float(torch.dot(e, e))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
