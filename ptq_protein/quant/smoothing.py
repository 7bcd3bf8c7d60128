"""SmoothQuant's smoothing factors (Xiao et al. 2023, eq. 4), from per-channel maxima.

``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``: dividing activation channel ``j``
by ``s_j`` and multiplying weight input-column ``j`` by it leaves ``X W^T``
unchanged while moving part of the activation's outlier range into the weight.
``alpha = 0.5`` balances the two; larger ``alpha`` moves more into the weights.

Example
-------
>>> smoothing_factors(torch.tensor([100.0, 1.0]), torch.tensor([1.0, 1.0]), alpha=0.5).tolist()
[10.0, 1.0]
"""

from __future__ import annotations

import torch

__all__ = ["smoothing_factors", "channel_max_ratio"]


def smoothing_factors(act_absmax: torch.Tensor, weight_absmax: torch.Tensor, alpha: float = 0.5,
                      min_value: float = 1e-5) -> torch.Tensor:
    """float32 factors [K] from the activations' and weights' per-input-channel absolute maxima [K].

    Maxima below ``min_value`` are raised to it (a channel that never fires, or a
    weight column of zeros, must not produce 0 or Inf), and so are the factors.
    """
    if act_absmax.shape != weight_absmax.shape or act_absmax.dim() != 1:
        raise ValueError(f"per-channel maxima must be two vectors of one length, got {tuple(act_absmax.shape)} "
                         f"and {tuple(weight_absmax.shape)}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} must be in [0, 1]")
    a = act_absmax.detach().double().abs().clamp_min(min_value)
    w = weight_absmax.detach().double().abs().clamp_min(min_value)
    return (a.pow(alpha) / w.pow(1.0 - alpha)).clamp_min(min_value).to(torch.float32)


def channel_max_ratio(absmax: torch.Tensor) -> float:
    """Largest over median per-channel absolute maximum: how far one channel's range sticks out."""
    a = absmax.detach().double().abs()
    return float(a.max() / a.median().clamp_min(1e-30))
