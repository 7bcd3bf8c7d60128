"""A pair tensor [B, L, L, C] held in int8: one scale per C-vector (token-wise), outlier vectors kept in float.

Why this design (measured on the pair states of ``tiny-esmfold`` and a real-width
trunk, BENCHMARKS.md "Long sequences"): the pair state's scale varies by orders of
magnitude between (i, j) positions (the diagonal, the recycled distogram bins and
the padding differ from the rest), so one scale per tensor or per channel would
spend the 8 bits on the largest rows. A symmetric absmax scale per C-vector (the
"token" of LightNobel's token-wise quantization) costs 4 bytes per C bytes of codes
(3% at C = 128) and bounds each vector's error by its own range. What is left is
the vectors whose range is dominated by a few channels (crest factor max/RMS
above :data:`OUTLIER_CREST`; a Gaussian vector's is about 2.5-3.5): their other
channels lose most of their bits. Those are
kept exactly, in float, in a side table (at most :data:`MAX_OUTLIER_FRACTION` of
the vectors of each written chunk, the highest crest first): LightNobel's
adaptive per-token precision reduced to two levels, int8 or float.

Writes and reads go by row or column chunks (``rows=slice`` / ``cols=slice``),
so no full-size float copy of the tensor ever exists. Each vector is written once
(every pair operation writes a new holder), so an outlier entry is never stale.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch

__all__ = ["Int8Pair", "quantize_vectors", "OUTLIER_CREST", "MAX_OUTLIER_FRACTION"]

QMAX = 127  # symmetric int8 codes [-127, 127]
OUTLIER_CREST = 4.0  # a vector is an outlier when max|x| / RMS(x) > 4 (its other values keep < 1/32 of the codes)
MAX_OUTLIER_FRACTION = 0.01  # at most 1% of a chunk's vectors kept in float
_TINY = 1e-30


def quantize_vectors(x: torch.Tensor):
    """(int8 codes, float32 scales [..., 1], outlier mask [...]) of ``x`` [..., C], one scale per C-vector."""
    xf = x.float()
    absmax = torch.linalg.vector_norm(xf, ord=math.inf, dim=-1, keepdim=True)
    scales = (absmax / QMAX).clamp_min(_TINY)
    codes = (xf / scales).round_().clamp_(-QMAX, QMAX).to(torch.int8)
    rms = torch.linalg.vector_norm(xf, dim=-1, keepdim=True) / math.sqrt(x.shape[-1])
    crest = (absmax / rms.clamp_min(_TINY)).squeeze(-1)
    outliers = crest > OUTLIER_CREST
    cap = math.ceil(MAX_OUTLIER_FRACTION * crest.numel())
    if int(outliers.sum()) > cap:  # keep the highest crest factors only
        keep = torch.zeros(crest.numel(), dtype=torch.bool, device=x.device)
        if cap:
            keep[torch.topk(crest.flatten(), cap).indices] = True
        outliers = outliers & keep.view_as(outliers)
    return codes, scales, outliers


class Int8Pair:
    """``[B, L, L, C]`` values as int8 codes x per-vector scale, outlier vectors exact.

    Parameters
    ----------
    batch, length, channels : the shape ``[B, L, L, C]``.
    dtype : the float dtype reads return.
    device : where codes and scales live.
    """

    def __init__(self, batch: int, length: int, channels: int, dtype: torch.dtype, device=None) -> None:
        self.shape = (batch, length, length, channels)
        self.dtype = dtype
        self.codes = torch.empty(self.shape, dtype=torch.int8, device=device)
        self.scales = torch.empty(self.shape[:-1] + (1,), dtype=torch.float32, device=device)
        self._index: List[torch.Tensor] = []  # flat (b, i, j) indices of outlier vectors
        self._values: List[torch.Tensor] = []  # their exact values [n, C]
        self._cat: Optional[tuple] = None

    @property
    def nbytes(self) -> int:
        index, values = self._outliers()
        return (self.codes.numel() + 4 * self.scales.numel() + index.numel() * 8
                + values.numel() * values.element_size())

    @property
    def outlier_count(self) -> int:
        return int(self._outliers()[0].numel())

    def write(self, x: torch.Tensor, *, rows: Optional[slice] = None, cols: Optional[slice] = None) -> None:
        """Store float ``x`` as the rows ``[B, r, L, C]`` (or columns ``[B, L, c, C]``) selected."""
        where = self._where(rows, cols)
        codes, scales, outliers = quantize_vectors(x)
        self.codes[where] = codes
        self.scales[where] = scales
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
        out = (self.codes[where].to(torch.float32) * self.scales[where]).to(self.dtype)
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
