"""A pair tensor [B, L, L, C] held in int8: a scale and an offset per group of 16 channels, outlier vectors in float.

Why this design (measured on the pair tensors each operation of a real-width
ESMFold trunk writes, L = 256, random weights; BENCHMARKS.md "Long sequences"):

* **Per (i, j) vector, not per tensor or channel.** The pair state's scale varies
  by orders of magnitude between (i, j) positions (the diagonal, the recycled
  distogram bins and the padding differ from the rest), so a scale per tensor or per
  channel would spend the 8 bits on the largest rows: the "token" of LightNobel's
  token-wise quantization is the c_z-vector at (i, j).
* **Groups of :data:`GROUP` channels, asymmetric.** The vectors are near-Gaussian
  (median crest factor 2.75, median |mean| / std 0.06-0.1), so one absmax scale per
  128-vector is already close to what 8 bits allow (0.63% relative error per rounding);
  what helps is a tighter range: 16-channel groups with their own [min, max] range
  (0.38%) beat symmetric 16-channel groups (0.47%), symmetric 8-channel groups (0.39%,
  the same bytes) and one asymmetric range per vector (0.57%). Scale and offset are
  bfloat16 (the offset rounded down, the scale up, so every value stays in range):
  4 bytes per 16 codes, 160 bytes a 128-vector (125% of its int8 codes).
* **Outlier vectors** (crest factor max/RMS above :data:`OUTLIER_CREST`; a Gaussian
  vector's is about 2.5-3.5): the other channels of the peak's group lose most of their bits, so they
  are kept exactly, in float, in a side table (at most :data:`MAX_OUTLIER_FRACTION`
  of the vectors of each written chunk, the highest crest first): LightNobel's
  adaptive per-token precision reduced to two levels, int8 or float.

Writes and reads go by row or column chunks (``rows=slice`` / ``cols=slice``),
so no full-size float copy of the tensor ever exists. Each vector is written once
(every pair operation writes a new holder), so an outlier entry is never stale.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch

__all__ = ["Int8Pair", "quantize_vectors", "group_size", "vector_bytes", "GROUP", "OUTLIER_CREST",
           "MAX_OUTLIER_FRACTION", "dequantize_vectors"]

GROUP = 16  # channels sharing one scale and offset (when they divide c_z; else one group per vector)
_LEVELS = 255  # codes 0..255, stored as int8 minus 128
_PARAM_DTYPE = torch.bfloat16  # scale and offset of a group (2 bytes each)
_ROUND_MARGIN = 2.0 ** -7  # > bfloat16's relative rounding error (2^-8): the margin that makes rounding one-sided
OUTLIER_CREST = 4.0  # a vector is an outlier when max|x| / RMS(x) > 4 (one channel owns its group's range)
MAX_OUTLIER_FRACTION = 0.01  # at most 1% of a chunk's vectors kept in float
_TINY = 1e-30


def group_size(channels: int) -> int:
    """Channels per scale: :data:`GROUP` when it divides ``channels``, else the whole vector."""
    return GROUP if channels % GROUP == 0 else channels


def vector_bytes(channels: int) -> int:
    """Bytes one C-vector takes: C int8 codes + a bfloat16 scale and offset per group."""
    return channels + 4 * (channels // group_size(channels))


def quantize_vectors(x: torch.Tensor):
    """(int8 codes [..., C], scales and offsets [..., C / g] bfloat16, outlier mask [...]) of ``x`` [..., C].

    Each group of g channels maps [offset, offset + 255 scale] onto codes -128..127:
    ``x ~ offset + scale * (code + 128)``; the offset is rounded down and the scale up
    to bfloat16, so the group's range always fits and the rounding error is at most
    half a step.
    """
    xf = x.float()
    g = group_size(x.shape[-1])
    xg = xf.unflatten(-1, (-1, g))
    low, high = xg.amin(-1), xg.amax(-1)
    offsets = (low - low.abs() * _ROUND_MARGIN).to(_PARAM_DTYPE)
    span = high - offsets.float()
    scales = (span / _LEVELS * (1 + _ROUND_MARGIN)).clamp_min(_TINY).to(_PARAM_DTYPE)
    inverse = 1 / scales.float()
    steps = torch.addcmul((-offsets.float() * inverse - 128).unsqueeze(-1), xg, inverse.unsqueeze(-1))  # one pass
    codes = steps.round_().clamp_(-128, _LEVELS - 128).to(torch.int8).flatten(-2)
    absmax = torch.maximum(high.abs(), low.abs()).amax(-1)
    rms = torch.linalg.vector_norm(xf, dim=-1) / math.sqrt(x.shape[-1])
    crest = absmax / rms.clamp_min(_TINY)
    outliers = crest > OUTLIER_CREST
    cap = math.ceil(MAX_OUTLIER_FRACTION * crest.numel())
    if int(outliers.sum()) > cap:  # keep the highest crest factors only
        keep = torch.zeros(crest.numel(), dtype=torch.bool, device=x.device)
        if cap:
            keep[torch.topk(crest.flatten(), cap).indices] = True
        outliers = outliers & keep.view_as(outliers)
    return codes, scales, offsets, outliers


def dequantize_vectors(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """float32 values [..., C] of :func:`quantize_vectors`' codes, scales and offsets."""
    scale = scales.float().unsqueeze(-1)
    base = offsets.float().unsqueeze(-1) + 128 * scale  # the value of code 0
    return codes.unflatten(-1, (scales.shape[-1], -1)).to(torch.float32).mul_(scale).add_(base).flatten(-2)


class Int8Pair:
    """``[B, L, L, C]`` values as int8 codes with a scale and offset per channel group, outlier vectors exact.

    Parameters
    ----------
    batch, length, channels : the shape ``[B, L, L, C]``.
    dtype : the float dtype reads return.
    device : where codes, scales and offsets live.
    """

    def __init__(self, batch: int, length: int, channels: int, dtype: torch.dtype, device=None) -> None:
        self.shape = (batch, length, length, channels)
        self.dtype = dtype
        self.codes = torch.empty(self.shape, dtype=torch.int8, device=device)
        groups = (channels // group_size(channels),)
        self.scales = torch.empty(self.shape[:-1] + groups, dtype=_PARAM_DTYPE, device=device)
        self.offsets = torch.empty(self.shape[:-1] + groups, dtype=_PARAM_DTYPE, device=device)
        self._index: List[torch.Tensor] = []  # flat (b, i, j) indices of outlier vectors
        self._values: List[torch.Tensor] = []  # their exact values [n, C]
        self._cat: Optional[tuple] = None

    @property
    def nbytes(self) -> int:
        index, values = self._outliers()
        stored = (self.codes, self.scales, self.offsets, index, values)
        return sum(t.numel() * t.element_size() for t in stored)

    @property
    def outlier_count(self) -> int:
        return int(self._outliers()[0].numel())

    def write(self, x: torch.Tensor, *, rows: Optional[slice] = None, cols: Optional[slice] = None) -> None:
        """Store float ``x`` as the rows ``[B, r, L, C]`` (or columns ``[B, L, c, C]``) selected."""
        where = self._where(rows, cols)
        codes, scales, offsets, outliers = quantize_vectors(x)
        self.codes[where] = codes
        self.scales[where] = scales
        self.offsets[where] = offsets
        if bool(outliers.any()):
            b, i, j = outliers.nonzero().unbind(-1)
            i, j = (i + (rows.start or 0), j) if rows is not None else (i, j + (cols.start or 0))
            n = self.shape[1]
            self._index.append((b * n + i) * n + j)
            self._values.append(x[outliers].to(self.dtype))
            self._cat = None

    def read(self, *, rows: Optional[slice] = None, cols: Optional[slice] = None) -> torch.Tensor:
        """The float values of the rows (``[B, r, L, C]``) or columns (``[B, L, c, C]``) selected."""
        where = self._where(rows, cols)
        out = dequantize_vectors(self.codes[where], self.scales[where], self.offsets[where]).to(self.dtype)
        index, values = self._outliers()
        if index.numel():
            b, i, j = self._unravel(index)
            span = rows if rows is not None else cols
            axis = i if rows is not None else j
            start = span.start or 0
            stop = self.shape[1] if span.stop is None else span.stop
            hit = (axis >= start) & (axis < stop)
            if bool(hit.any()):
                if rows is not None:
                    out[b[hit], i[hit] - start, j[hit]] = values[hit]
                else:
                    out[b[hit], i[hit], j[hit] - start] = values[hit]
        return out

    def _where(self, rows: Optional[slice], cols: Optional[slice]):
        if (rows is None) == (cols is None):
            raise ValueError("give exactly one of rows= or cols=")
        return (slice(None), rows) if rows is not None else (slice(None), slice(None), cols)

    def _unravel(self, index: torch.Tensor):
        n = self.shape[1]
        return index // (n * n), (index // n) % n, index % n

    def _outliers(self):
        if self._cat is None:
            if self._index:
                self._index, self._values = [torch.cat(self._index)], [torch.cat(self._values)]
            self._cat = (self._index[0], self._values[0]) if self._index else (
                torch.empty(0, dtype=torch.long), torch.empty(0, self.shape[-1], dtype=self.dtype))
        return self._cat
