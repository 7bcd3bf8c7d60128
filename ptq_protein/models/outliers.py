"""Plant trained-ESM-like outlier channels in small random models, and measure them.

Trained ESM-2 (and ESMFold's ESM-2 stem) carries a few residual-stream channels
whose values are huge, of one sign, and heavy-tailed over tokens (largest on a
few tokens such as BOS/EOS). Per-tensor uniform 8-bit activation quantization
spends its whole range on them, which is why uniform A8 fails on ESMFold and
why piecewise-linear or outlier-aware schemes help. A random tiny model has no
such channels, so quantization experiments on it would show no effect.

:func:`plant_outlier_channels_` writes them in, deterministically from a seed:

* **embedding columns**: for each planted channel c (sign s_c alternating +,-),
  every token row gets ``s_c * scale * exp(log_sigma * z_t)`` with z_t ~ N(0, 1)
  (log-normal: one-sided, right-skewed), and the "tail" tokens (BOS/EOS) get
  ``tail_factor`` times the largest of those (the heavy tail: a few tokens per
  sequence far out). The padding row stays zero.
* **FFN output rows**: each layer's second FFN linear writes into channel c
  with weights ``s_c * ffn_gain * |w|``; its inputs (GELU outputs) are mostly
  positive, so the channel keeps its sign and grows with depth, as in trained models.

LayerNorm weights are left alone: the planted channels therefore dominate
LayerNorm statistics and also show up, bounded, after LayerNorm.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence

import torch
from torch import nn

__all__ = ["OutlierSpec", "plant_outlier_channels_", "channel_kurtosis", "channel_asymmetry"]


@dataclasses.dataclass(frozen=True)
class OutlierSpec:
    """How many outlier channels to plant and how strong they are.

    Magnitudes are relative to the other embedding channels, which have std 1.
    """

    num_channels: int = 2
    scale: float = 6.0
    log_sigma: float = 0.5
    tail_factor: float = 5.0
    ffn_gain: float = 2.0
    seed_offset: int = 7919  # decorrelates the channel draw from the weight init with the same seed

    def __post_init__(self) -> None:
        if self.num_channels < 1:
            raise ValueError(f"OutlierSpec.num_channels={self.num_channels} must be >= 1 (use outliers=None for none)")
        for name in ("scale", "log_sigma", "tail_factor", "ffn_gain"):
            if getattr(self, name) <= 0:
                raise ValueError(f"OutlierSpec.{name}={getattr(self, name)} must be > 0")

    def to_dict(self) -> Dict[str, float]:
        return dataclasses.asdict(self)


@torch.no_grad()
def plant_outlier_channels_(embedding: nn.Embedding, ffn_outputs: Sequence[nn.Linear], spec: OutlierSpec, *,
                            seed: int, tail_tokens: Sequence[int] = ()) -> List[int]:
    """Write outlier channels into ``embedding`` and each FFN output linear, in place.

    Parameters
    ----------
    embedding
        Token embedding, weight shape (vocab, D); its ``padding_idx`` row is left zero.
    ffn_outputs
        The linear writing each layer's FFN result into the residual stream
        (fair-esm ``layers[i].fc2``, transformers ``encoder.layer[i].output.dense``),
        weight shape (D, hidden).
    spec
        Strengths; see :class:`OutlierSpec`.
    seed
        Chooses the channels and token magnitudes.
    tail_tokens
        Token ids set to ``tail_factor`` times the largest regular value (BOS/EOS).

    Returns
    -------
    list of int
        The planted channel indices, sorted.
    """
    weight = embedding.weight
    vocab, dim = weight.shape
    if spec.num_channels > dim:
        raise ValueError(f"cannot plant {spec.num_channels} outlier channels in a {dim}-wide model")
    generator = torch.Generator().manual_seed(seed + spec.seed_offset)
    channels = torch.randperm(dim, generator=generator)[:spec.num_channels].sort().values.tolist()
    signs = [1.0 if k % 2 == 0 else -1.0 for k in range(len(channels))]
    for c, sign in zip(channels, signs):
        z = torch.randn(vocab, generator=generator, dtype=torch.float64)
        column = spec.scale * torch.exp(spec.log_sigma * z)
        column[list(tail_tokens)] = spec.tail_factor * column.max()
        column *= sign
        weight[:, c] = column.to(weight.dtype)
        for linear in ffn_outputs:
            linear.weight[c, :] = sign * spec.ffn_gain * linear.weight[c, :].abs()
    if embedding.padding_idx is not None:
        weight[embedding.padding_idx].zero_()
    return channels


def channel_kurtosis(x: torch.Tensor) -> torch.Tensor:
    """Pearson kurtosis (3 for a Gaussian) of each channel of ``x`` (shape (N, D)), in float64."""
    x = _as_rows(x)
    centered = x - x.mean(dim=0)
    variance = centered.pow(2).mean(dim=0)
    return centered.pow(4).mean(dim=0) / variance.clamp_min(1e-300).pow(2)


def channel_asymmetry(x: torch.Tensor) -> torch.Tensor:
    """Per channel ``max(|max|, |min|) / min(|max|, |min|)``: about 1 when symmetric, large when one-sided."""
    x = _as_rows(x)
    top, bottom = x.max(dim=0).values.abs(), x.min(dim=0).values.abs()
    return torch.maximum(top, bottom) / torch.minimum(top, bottom).clamp_min(1e-12)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() < 2:
        raise ValueError(f"expected activations of shape (..., D), got shape {tuple(x.shape)}")
    return x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
