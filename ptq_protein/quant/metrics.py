"""Quantization error metrics (float64): mean squared error and SQNR."""

from __future__ import annotations

import math
from typing import Callable

import torch

__all__ = ["quantization_mse", "sqnr_db"]


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
    x64, e64 = x.to(torch.float64), xq.to(torch.float64) - x.to(torch.float64)
    signal, noise = float((x64**2).sum()), float((e64**2).sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
