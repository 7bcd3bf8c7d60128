"""Streaming histogram observer and exact quantization error on a histogram.

:class:`HistogramObserver` keeps ``bins`` float64 counts on a uniform grid. When
new data fall outside the grid it widens the grid by an integer factor ``k`` with
the new edges on old edges, so old bins merge whole into new ones: counts are
never split or spread. The approximation is only resolution: bins get ``k`` times
coarser (the data then cover at least about half the grid), and the first
update's range sets the grid's alignment. Exact min and max are tracked beside
the counts and clamp the outermost edges in :meth:`HistogramObserver.support`.

:func:`expected_sq_error` integrates ``(x - Q(x))^2`` exactly for a step-function
quantizer ``Q`` against the histogram's piecewise-uniform density (mass spread
evenly within each bin), vectorized over a batch of candidate quantizers; the
range and breakpoint searches are built on it.
"""

from __future__ import annotations

import math

import torch

from ptq_protein.quant.observers import prepare_update

__all__ = ["HistogramObserver", "expected_sq_error", "nearest_level_bounds"]

DEFAULT_BINS = 2048
# Narrowest first-update span relative to the values' magnitude: keeps bin edges
# far above float64 resolution (2^-52) when the first batch is (nearly) constant.
_MIN_REL_SPAN = 2.0**-20
_MIN_ABS_SPAN = 1e-30
_CHUNK_ELEMENTS = 1 << 22  # candidates x (levels + edges) evaluated per chunk


class HistogramObserver:
    """Streaming histogram of valid values with a growing range.

    Parameters
    ----------
    bins : int
        Number of bins (>= 2); memory is ``bins`` float64 counts.
    """

    def __init__(self, bins: int = DEFAULT_BINS):
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
            raise ValueError(f"bins={bins!r} must be an integer >= 2")
        self.bins = bins
        self.counts = torch.zeros(bins, dtype=torch.float64)
        self.lo = 0.0
        self.width = 0.0
        self.min_val = math.inf
        self.max_val = -math.inf

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    @property
    def edges(self) -> torch.Tensor:
        """Grid edges ``[bins + 1]`` (float64)."""
        return self.lo + self.width * torch.arange(self.bins + 1, dtype=torch.float64)

    def update(self, x: torch.Tensor, checked: bool = False, extremes: tuple | None = None) -> None:
        """Add a batch of finite values (any shape); empty input is ignored.

        ``extremes`` = ``(min, max)`` of ``x`` when the caller already has them.
        """
        x = prepare_update(x, per_channel=False, seen=None, checked=checked)
        if x is None:
            return
        dmin, dmax = (float(v) for v in (torch.aminmax(x) if extremes is None else extremes))
        if self.width == 0.0:
            span = max(dmax - dmin, _MIN_REL_SPAN * max(abs(dmin), abs(dmax)), _MIN_ABS_SPAN)
            mid = 0.5 * (dmin + dmax)
            self.lo, self.width = mid - 0.5 * span, span / self.bins
        else:
            self._grow(dmin, dmax)
        # clamp, then truncate: equal to floor on the clamped (non-negative) values, one pass less
        idx = ((x - self.lo) / self.width).clamp_(0, self.bins - 1).long()
        self.counts += torch.bincount(idx, minlength=self.bins).to(torch.float64)
        self.min_val, self.max_val = min(self.min_val, dmin), max(self.max_val, dmax)

    def _grow(self, dmin: float, dmax: float) -> None:
        """Widen the grid by an integer factor so that it covers ``[dmin, dmax]``."""
        b, w = self.bins, self.width
        need_lo = max(0, math.ceil((self.lo - dmin) / w))
        need_hi = max(0, math.ceil((dmax - (self.lo + b * w)) / w))
        if need_lo == 0 and need_hi == 0:
            return
        k = math.ceil((b + need_lo + need_hi) / b)
        pad_lo = need_lo + (b * k - b - need_lo - need_hi) // 2
        # New bin of each old bin, via its centre: an exact merge of whole bins while
        # k * b < 2^52; beyond that (a near-constant first batch) the old grid is far
        # narrower than one new bin and lands in the bin holding it.
        centres = torch.arange(b, dtype=torch.float64) + 0.5 + float(pad_lo)
        new_idx = torch.floor(centres / float(k)).clamp_(0, b - 1).long()
        self.counts = torch.zeros(b, dtype=torch.float64).index_add_(0, new_idx, self.counts)
        self.lo, self.width = self.lo - pad_lo * w, k * w

    def support(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(counts [bins], edges [bins + 1])`` with edges clamped to the exact min/max."""
        if self.width == 0.0:
            raise ValueError("HistogramObserver has seen no values: run calibration data through the site")
        return self.counts.clone(), self.edges.clamp(self.min_val, self.max_val)

    def percentile(self, q: float) -> float:
        """Value below which ``q`` percent of the mass lies, interpolated within a bin.

        Accurate to one bin width (of the final grid) against the exact percentile
        of all values seen.
        """
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"percentile q={q} must be in [0, 100]")
        counts, edges = self.support()
        cum = torch.cumsum(counts, 0)
        target = q / 100.0 * float(cum[-1])
        i = int(torch.searchsorted(cum, torch.tensor([target], dtype=torch.float64))[0].clamp(max=self.bins - 1))
        before = float(cum[i - 1]) if i > 0 else 0.0
        frac = (target - before) / float(counts[i]) if counts[i] > 0 else 0.0
        value = float(edges[i]) + min(max(frac, 0.0), 1.0) * float(edges[i + 1] - edges[i])
        return min(max(value, self.min_val), self.max_val)


def nearest_level_bounds(levels: torch.Tensor) -> torch.Tensor:
    """Rounding boundaries ``[..., L-1]`` (midpoints) of ascending ``levels [..., L]``."""
    return 0.5 * (levels[..., 1:] + levels[..., :-1])


def expected_sq_error(
    levels: torch.Tensor,
    counts: torch.Tensor,
    edges: torch.Tensor,
    bounds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean squared quantization error of step quantizers under a histogram density.

    Parameters
    ----------
    levels : Tensor ``[C, L]`` or ``[L]``
        Output levels of ``C`` candidate quantizers, ascending along ``L``.
    counts : Tensor ``[B]``
        Histogram mass per bin (>= 0, positive total).
    edges : Tensor ``[B + 1]``
        Non-decreasing bin edges; a zero-width bin holding mass is a point mass.
    bounds : Tensor ``[C, L-1]``, optional
        Decision boundaries (``x`` in ``[bounds[i-1], bounds[i])`` maps to
        ``levels[i]``); default midpoints, i.e. round to nearest level.

    Returns
    -------
    Tensor ``[C]`` (or scalar), float64: ``E[(x - Q(x))^2]`` with mass uniform within
    each bin, values beyond the outer levels clamped.

    Notes
    -----
    With fewer levels than bins the error is summed per quantization cell from the
    histogram's cumulative moments (cost ``C * L``); otherwise per bin from the
    quantizer's cumulative error (cost ``C * (L + B)``), which avoids cancellation
    when cells are much narrower than bins. Both are exact for the density.
    """
    squeeze = levels.dim() == 1
    lv = levels.reshape(-1, levels.shape[-1]).to(torch.float64)
    bd = nearest_level_bounds(lv) if bounds is None else bounds.reshape(lv.shape[0], -1).to(torch.float64)
    counts, edges = counts.to(torch.float64), edges.to(torch.float64)
    total = float(counts.sum())
    if total <= 0:
        raise ValueError("expected_sq_error needs a histogram with positive total mass")
    centre = 0.5 * float(edges[0] + edges[-1])  # shift: the error is translation invariant
    lv, bd, edges = lv - centre, bd - centre, edges - centre
    width = edges[1:] - edges[:-1]
    point_mass = bool(((width <= 0) & (counts > 0)).any())
    by_cell = lv.shape[1] <= counts.numel() and not point_mass
    fn = _cell_error if by_cell else _bin_error
    chunk = max(1, _CHUNK_ELEMENTS // (lv.shape[1] + (0 if by_cell else edges.numel())))
    out = torch.cat([fn(lv[i:i + chunk], bd[i:i + chunk], counts, edges)
                     for i in range(0, lv.shape[0], chunk)]) / total
    return out[0] if squeeze else out


def _cell_error(lv: torch.Tensor, bd: torch.Tensor, counts: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Per-cell sum of ``int (x - l)^2 rho`` from the cumulative moments of the density."""
    width = edges[1:] - edges[:-1]
    rho = torch.where(width > 0, counts / torch.where(width > 0, width, torch.ones_like(width)), 0.0)
    e_lo = edges[:-1]
    # P_k at each edge: cumulative int x^k rho dx, k = 0, 1, 2.
    pk = [torch.cat([edges.new_zeros(1), torch.cumsum(rho * (edges[1:] ** (k + 1) - e_lo ** (k + 1)) / (k + 1), 0)])
          for k in range(3)]
    x = torch.cat([edges[:1].expand(lv.shape[0], 1), bd.clamp(edges[0], edges[-1]),
                   edges[-1:].expand(lv.shape[0], 1)], 1)
    i = (torch.searchsorted(edges, x.contiguous(), right=True) - 1).clamp_(0, counts.numel() - 1)
    r, t = rho[i], x - e_lo[i]  # local offset inside the bin: no cancellation
    e = e_lo[i]
    # int_e^x s^k ds for k = 0, 1, 2, written in the local offset t = x - e.
    local = (t, t * (e + 0.5 * t), t * (e * e + e * t + t * t / 3.0))
    d = [torch.diff(pk[k][i] + r * local[k], dim=1) for k in range(3)]
    return (d[2] - 2.0 * lv * d[1] + lv * lv * d[0]).sum(1)


def _bin_error(lv: torch.Tensor, bd: torch.Tensor, counts: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Per-bin ``mass * mean squared error`` from the quantizer's cumulative error."""
    c = lv.shape[0]
    # Antiderivative H(x) = A_k + (x - l_k)^3 / 3 on cell k, continuous across cells.
    jump = ((bd - lv[:, :-1]) ** 3 - (bd - lv[:, 1:]) ** 3) / 3.0
    a = torch.cat([torch.zeros(c, 1, dtype=lv.dtype), torch.cumsum(jump, 1)], 1)
    e = edges.expand(c, -1).contiguous()
    cell = torch.searchsorted(bd.contiguous(), e, right=True)
    le = lv.gather(1, cell)
    h = a.gather(1, cell) + (e - le) ** 3 / 3.0
    width = edges[1:] - edges[:-1]
    wide = width > 0
    integral = (h[:, 1:] - h[:, :-1]) / torch.where(wide, width, torch.ones_like(width))
    point = (e[:, :-1] - le[:, :-1]) ** 2
    return (torch.where(wide, integral, point) * counts).sum(1)
