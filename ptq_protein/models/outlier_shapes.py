"""More outlier shapes for random models: LayerNorm-gain channels and attention sinks, beside the residual ones.

Quantization methods differ in which outliers they handle. SmoothQuant migrates per-*input-channel* scale from
the activations feeding a linear into its weights; piecewise-linear and per-token schemes handle a few extreme
*tokens*; clipping and rotations handle massive *residual-stream* channels (:mod:`ptq_protein.models.outliers`).
A benchmark on one shape alone says nothing about the others, so a random model can carry any of
:class:`OutlierShape`, deterministically from a seed:

* **residual** (alias ``outliers``): :func:`~ptq_protein.models.outliers.plant_outlier_channels_`.
* **ln-gain** (:func:`plant_ln_gain_`): a few channels of every LayerNorm gain feeding a linear (attention's and
  the FFN's) multiplied by ``low``..``high`` (x20-50), the same channels in every layer, as in trained
  transformers whose LayerNorm outputs carry outlier input channels (the SmoothQuant paper's Fig. 4); the
  following weights are left flat, and the residual stream is not planted.
* **sink** (:func:`plant_attention_sink_`): the BOS and EOS embedding rows moved far out along a few channels
  (``scale * sqrt(D)`` each), so those tokens' hidden states are extreme in every layer; and each head's
  lowest-frequency rotary dimension reads those channels in its keys and a constant in its queries, so every
  query adds about ``attention_logit`` to its logit for the sink tokens and attention piles onto them (trained
  ESM-2 attends to ``<cls>``/``<eos>`` this way). The lowest rotary frequency turns by at most ~0.3 rad over 1024
  positions, so the boost holds at every distance.
* **mix**: all three (residual, then ln-gain, then sink).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Dict, FrozenSet, List, Sequence, Tuple, Union

import torch

__all__ = ["OutlierShape", "SHAPE_NAMES", "LnGainSpec", "SinkSpec", "plant_ln_gain_", "plant_attention_sink_"]


class OutlierShape(str, enum.Enum):
    """Which outliers a random model carries (see the module docstring)."""

    PLAIN = "plain"
    RESIDUAL = "residual"
    LN_GAIN = "ln-gain"
    SINK = "sink"
    MIX = "mix"

    @classmethod
    def parse(cls, value: Union[str, bool, "OutlierShape"]) -> "OutlierShape":
        """A shape from its name, the alias ``outliers`` (= residual), or a bool (False: plain, True: residual)."""
        if isinstance(value, bool):
            return cls.RESIDUAL if value else cls.PLAIN
        name = _ALIASES.get(str(getattr(value, "value", value)), value)
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"outlier shape {value!r}: one of {', '.join(SHAPE_NAMES)}") from None

    @property
    def parts(self) -> FrozenSet["OutlierShape"]:
        """The single shapes planted (mix: all three; plain: none)."""
        if self is OutlierShape.MIX:
            return frozenset({OutlierShape.RESIDUAL, OutlierShape.LN_GAIN, OutlierShape.SINK})
        return frozenset() if self is OutlierShape.PLAIN else frozenset({self})


_ALIASES: Dict[str, str] = {"outliers": OutlierShape.RESIDUAL.value}  # the name benches and docs used first
SHAPE_NAMES: Tuple[str, ...] = (*_ALIASES, *(s.value for s in OutlierShape))


@dataclasses.dataclass(frozen=True)
class LnGainSpec:
    """How many LayerNorm-gain channels, and their gain range (uniform in ``low``..``high``)."""

    num_channels: int = 3
    low: float = 20.0
    high: float = 50.0
    seed_offset: int = 104729  # decorrelates the channel draw from the residual shape's and the weight init

    def __post_init__(self) -> None:
        if self.num_channels < 1:
            raise ValueError(f"LnGainSpec.num_channels={self.num_channels} must be >= 1")
        if not 0 < self.low <= self.high:
            raise ValueError(f"LnGainSpec low={self.low}, high={self.high}: need 0 < low <= high")


@dataclasses.dataclass(frozen=True)
class SinkSpec:
    """Sink channels, their size in the sink rows (``scale * sqrt(D)``) and the attention logit they add."""

    num_channels: int = 2
    scale: float = 30.0
    attention_logit: float = 6.0
    seed_offset: int = 1299709

    def __post_init__(self) -> None:
        if self.num_channels < 1:
            raise ValueError(f"SinkSpec.num_channels={self.num_channels} must be >= 1")
        for name in ("scale", "attention_logit"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SinkSpec.{name}={getattr(self, name)} must be > 0")


@torch.no_grad()
def plant_ln_gain_(gains: Sequence[torch.Tensor], spec: LnGainSpec, *, seed: int) -> List[int]:
    """Multiply the same ``spec.num_channels`` channels of every LayerNorm gain (each shape (D,)) in place.

    Returns the channel indices, sorted. Example: ``plant_ln_gain_([ln.weight for ln in norms], LnGainSpec(),
    seed=0)``.
    """
    dim = _common_width(gains, "LayerNorm gains")
    generator = torch.Generator().manual_seed(seed + spec.seed_offset)
    channels = _draw_channels(dim, spec.num_channels, generator)
    factors = spec.low + (spec.high - spec.low) * torch.rand(len(channels), generator=generator, dtype=torch.float64)
    for gain in gains:
        gain[channels] *= factors.to(gain.dtype)
    return channels


@torch.no_grad()
def plant_attention_sink_(embedding: torch.Tensor, attentions: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                          heads: int, spec: SinkSpec, *, seed: int, sink_tokens: Sequence[int]) -> List[int]:
    """Make ``sink_tokens`` attention sinks (see the module docstring), in place.

    Parameters
    ----------
    embedding
        Token embedding weight, shape (vocab, D); the sink rows get ``+-scale * sqrt(D)`` in the sink channels.
    attentions
        Per layer ``(q_bias, k_weight)``: the query projection's bias, shape (D,), and the key projection's
        weight, shape (D, D) (rows: output dims, heads in order, rotary halves in each head).
    heads
        Attention heads per layer.
    sink_tokens
        Token ids made sinks (BOS/EOS).

    Returns
    -------
    list of int
        The sink channels, sorted.
    """
    vocab, dim = embedding.shape
    if dim % heads or (dim // heads) % 2:
        raise ValueError(f"width {dim} with {heads} heads: need an even head dimension for rotary pairs")
    generator = torch.Generator().manual_seed(seed + spec.seed_offset)
    channels = _draw_channels(dim, spec.num_channels, generator)
    signs = torch.tensor([1.0 if k % 2 == 0 else -1.0 for k in range(len(channels))], dtype=torch.float64)
    for token in sink_tokens:
        embedding[token, channels] = (signs * spec.scale * math.sqrt(dim)).to(embedding.dtype)
    head_dim = dim // heads
    # A sink's LayerNorm output is ~ sign_c * sqrt(D / n) in each of its n channels, so key weights 1/sqrt(D)
    # give k = sqrt(n); the query constant b then adds b * sqrt(n) / sqrt(head_dim) (the attention scaling).
    key_weight = 1.0 / math.sqrt(dim)
    query = spec.attention_logit * math.sqrt(head_dim) / math.sqrt(len(channels))
    for q_bias, k_weight in attentions:
        _check_attention(q_bias, k_weight, dim)
        for head in range(heads):
            row = head * head_dim + head_dim // 2 - 1  # rotate_half pairs (i, i + head_dim/2): i = last is slowest
            k_weight[row] = 0.0
            k_weight[row, channels] = (signs * key_weight).to(k_weight.dtype)
            q_bias[row] = query
    return channels


def _draw_channels(dim: int, count: int, generator: torch.Generator) -> List[int]:
    if count > dim:
        raise ValueError(f"cannot plant {count} channels in a {dim}-wide model")
    return torch.randperm(dim, generator=generator)[:count].sort().values.tolist()


def _common_width(tensors: Sequence[torch.Tensor], what: str) -> int:
    widths = {tuple(t.shape) for t in tensors}
    if len(widths) != 1 or len(next(iter(widths))) != 1:
        raise ValueError(f"{what}: expected one shape (D,) for all, got {sorted(widths)}")
    return next(iter(widths))[0]


def _check_attention(q_bias: torch.Tensor, k_weight: torch.Tensor, dim: int) -> None:
    if tuple(q_bias.shape) != (dim,) or tuple(k_weight.shape) != (dim, dim):
        raise ValueError(f"attention tensors of shapes {tuple(q_bias.shape)}, {tuple(k_weight.shape)}: expected "
                         f"a query bias ({dim},) and a key weight ({dim}, {dim})")
