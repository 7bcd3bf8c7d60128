"""Distribution-free PWLQ search: minimise the exact histogram MSE of the real codebook.

Each candidate codebook (breakpoints as fractions of the side's range, codes per
piece, and for asymmetric data the zero code, i.e. how many codes each side
gets) is turned into its levels with :func:`ptq_protein.quant.pwlq.side_affine`
(the builders' own formula) and scored with
:func:`ptq_protein.quant.histogram.expected_sq_error` (rounding inside pieces,
clamping at the ends, mass uniform within bins), a batch of candidates at a time.
Coordinate descent visits the zero code (asymmetric only), then each breakpoint on
a 2-D grid over its position and the code split between the two pieces it
separates (the two are strongly coupled: the best breakpoint moves out as the
centre gets more codes), with windows that shrink every sweep. The returned
error is re-evaluated on the float32 codebook actually built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ptq_protein.quant.codebook import PiecewiseCodebook, codebook_step_function
from ptq_protein.quant.histogram import expected_sq_error
from ptq_protein.quant.pwlq import MAX_BREAKPOINTS, default_piece_codes, pwlq_from_breakpoints, side_affine
from ptq_protein.quant.uniform import choose_qparams, qrange

__all__ = ["PwlqSearchResult", "search_pwlq", "uniform_levels"]

_MIN_RANGE = 1e-30  # floor for an all-zero histogram: keeps float32 steps normal at 16 bits
# Floor of a side's range relative to the other side (e.g. the negative side of
# sigmoid outputs): with a shifted zero code the other side's offsets carry
# float32 noise ~1e-7 of its range, which a narrower side's levels would not clear.
_MIN_SIDE_FRACTION = 2.0**-8
_MARGIN = 1e-4  # breakpoint candidates stay this fraction away from their neighbours
_SHRINK = 4.0  # the search windows narrow by this factor every sweep


@dataclass(frozen=True)
class PwlqSearchResult:
    """Best codebook and its expected MSE, with the uniform baseline on the same range."""

    codebook: PiecewiseCodebook
    mse: float
    uniform_mse: float
    neg_breaks: tuple[float, ...]
    pos_breaks: tuple[float, ...]
    codes_per_piece: tuple[tuple[int, ...], tuple[int, ...]]
    zero_code: int

    @property
    def ratio(self) -> float:
        """PWLQ MSE over uniform MSE (below 1 means PWLQ is better)."""
        return self.mse / self.uniform_mse if self.uniform_mse > 0 else float("nan")


@dataclass
class _Side:
    """Mutable search state of one side: range, breakpoint fractions, piece codes."""

    m: float
    fracs: list[float]
    counts: list[int]


def search_pwlq(
    counts: torch.Tensor,
    edges: torch.Tensor,
    bits: int,
    n_breakpoints: int = 1,
    symmetric: bool = True,
    search_split: bool = True,
    grid: int = 32,
    sweeps: int = 4,
) -> PwlqSearchResult:
    """Search breakpoints (and code split) minimising the histogram MSE.

    Parameters
    ----------
    counts, edges : Tensor ``[B]``, ``[B + 1]``
        Histogram (e.g. ``HistogramObserver.support()``); the outer edges are the
        range: ``m = max(|edges[0]|, |edges[-1]|)`` if symmetric, else
        ``m_neg = -edges[0]``, ``m_pos = edges[-1]``, each floored at ``2^-8`` of
        the other (a one-sided histogram gets a token opposite side).
    bits : int
        Total code width (codes in ``[-qmax, qmax]``, or ``[-2^(b-1), qmax]`` asymmetric).
    n_breakpoints : int
        Breakpoints per side, 1..3.
    symmetric : bool
        Mirror-image sides sharing parameters (zero code 0), or independent sides
        whose code budgets (the zero code) are searched too.
    search_split : bool
        Also optimise the codes per piece and, if asymmetric, per side (else equal
        splits and zero code 0).
    grid, sweeps : int
        Candidates per coordinate and coordinate-descent sweeps.

    Returns
    -------
    PwlqSearchResult
    """
    if not 1 <= n_breakpoints <= MAX_BREAKPOINTS:
        raise ValueError(f"n_breakpoints={n_breakpoints} must be in [1, {MAX_BREAKPOINTS}]")
    if grid < 2 or sweeps < 1:
        raise ValueError(f"need grid >= 2 and sweeps >= 1, got grid={grid}, sweeps={sweeps}")
    counts, edges = counts.to(torch.float64), edges.to(torch.float64)
    qmin, qmax = qrange(bits, symmetric)
    lo, hi = float(edges[0]), float(edges[-1])
    if symmetric:
        m = max(abs(lo), abs(hi), _MIN_RANGE)
        sides = [_init_side(m, n_breakpoints, qmax)]
    else:
        m_neg, m_pos = max(-lo, _MIN_RANGE), max(hi, _MIN_RANGE)
        m_neg, m_pos = max(m_neg, _MIN_SIDE_FRACTION * m_pos), max(m_pos, _MIN_SIDE_FRACTION * m_neg)
        sides = [_init_side(m_neg, n_breakpoints, -qmin), _init_side(m_pos, n_breakpoints, qmax)]
    codes = torch.arange(qmin, qmax + 1, dtype=torch.float64)

    def score(batch: list[tuple]) -> torch.Tensor:
        return expected_sq_error(_levels(batch, codes, qmin, symmetric), counts, edges)

    for sweep in range(sweeps):
        if search_split and not symmetric:
            _search_zero(sides, sweep, grid, score)
        for s in range(len(sides)):
            for i in range(n_breakpoints):
                _search_break(sides, s, i, sweep, grid, search_split, score)
    return _result(sides, symmetric, bits, counts, edges)


def uniform_levels(m_neg, m_pos, bits: int, symmetric: bool) -> torch.Tensor:
    """Levels ``[..., L]`` (float64) of the uniform quantizer for range ``[-m_neg, m_pos]``.

    ``m_neg``/``m_pos`` are floats or broadcastable tensors ``[...]``; the levels use
    the float32 scale and rounded zero point of :func:`choose_qparams`.
    """
    qmin, qmax = qrange(bits, symmetric)
    scale, zp = choose_qparams(-torch.as_tensor(m_neg), torch.as_tensor(m_pos), bits, symmetric)
    q = torch.arange(qmin, qmax + 1, dtype=torch.float64)
    return (q - zp.to(torch.float64)[..., None]) * scale.to(torch.float64)[..., None]


def _init_side(m: float, k: int, n_codes: int) -> _Side:
    if n_codes < k + 1:
        raise ValueError(f"{n_codes} codes per side cannot hold {k + 1} pieces: use more bits")
    return _Side(m, [0.5 * (i + 1) / (k + 1) for i in range(k)], list(default_piece_codes(n_codes, k + 1)))


def _magnitudes(m: float, fracs: torch.Tensor, counts: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Decoded magnitude ``[C, L]`` of side code index ``idx >= 1`` (fracs ``[C, K]``, counts ``[C, K+1]``)."""
    c = fracs.shape[0]
    knots = m * torch.cat([fracs.new_zeros(c, 1), fracs, fracs.new_ones(c, 1)], 1)
    off, sc = side_affine(knots, counts)
    cum = torch.cumsum(counts, 1).contiguous()
    piece = torch.searchsorted(cum, idx.contiguous(), right=False).clamp_(max=counts.shape[1] - 1)
    return off.gather(1, piece) + sc.gather(1, piece) * idx


def _levels(batch: list[tuple], codes: torch.Tensor, qmin: int, symmetric: bool) -> torch.Tensor:
    """Ascending levels ``[C, L]`` of every code, the zero code at ``qmin + negative codes``."""
    neg, pos = batch[0], batch[-1]
    zero = qmin + neg[2].sum(1, keepdim=True)
    d = codes - zero  # signed code distance from the zero code, [C, L]
    up = _magnitudes(*pos, d.clamp(min=1.0))
    down = up.flip(1) if symmetric else _magnitudes(*neg, (-d).clamp(min=1.0))
    return torch.where(d > 0, up, torch.where(d < 0, -down, torch.zeros_like(d)))


def _batch(sides: list[_Side], c: int, replace: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> list[tuple]:
    """Candidate tensors ``(m, fracs [C, K], counts [C, K+1])`` per side, some replaced."""
    out = []
    for t, side in enumerate(sides):
        if t in replace:
            out.append((side.m, *replace[t]))
        else:
            f = torch.tensor(side.fracs, dtype=torch.float64).expand(c, -1).contiguous()
            n = torch.tensor(side.counts, dtype=torch.float64).expand(c, -1).contiguous()
            out.append((side.m, f, n))
    return out


def _int_window(current: int, lo: int, hi: int, half: int, grid: int) -> torch.Tensor:
    """Up to ``grid`` integers around ``current`` within ``[lo, hi]``, ``current`` included."""
    a, b = max(lo, current - half), min(hi, current + half)
    vals = torch.linspace(a, b, min(grid, b - a + 1), dtype=torch.float64).round()
    return torch.unique(torch.cat([vals, torch.tensor([float(current)], dtype=torch.float64)]))


def _search_break(sides: list[_Side], s: int, i: int, sweep: int, grid: int, split: bool, score) -> None:
    """Grid over breakpoint ``i`` of side ``s`` (jointly with its pieces' code split)."""
    side = sides[s]
    left = side.fracs[i - 1] if i > 0 else 0.0
    right = side.fracs[i + 1] if i + 1 < len(side.fracs) else 1.0
    half = 0.5 * _SHRINK**-sweep
    a, b = max(left + _MARGIN, side.fracs[i] - half), min(right - _MARGIN, side.fracs[i] + half)
    fc = torch.cat([torch.linspace(a, b, grid, dtype=torch.float64),
                    torch.tensor([side.fracs[i]], dtype=torch.float64)])
    total = side.counts[i] + side.counts[i + 1]
    nc = torch.tensor([float(side.counts[i])], dtype=torch.float64)
    if split:
        nc = _int_window(side.counts[i], 1, total - 1, max(1, int(total * half)), grid // 2)
    c = fc.numel() * nc.numel()
    fr = torch.tensor(side.fracs, dtype=torch.float64).repeat(c, 1)
    n = torch.tensor(side.counts, dtype=torch.float64).repeat(c, 1)
    fr[:, i] = fc.repeat_interleave(nc.numel())
    n[:, i] = nc.repeat(fc.numel())
    n[:, i + 1] = total - n[:, i]
    best = int(torch.argmin(score(_batch(sides, c, {s: (fr, n)}))))
    side.fracs[i], side.counts[i] = float(fr[best, i]), int(n[best, i])
    side.counts[i + 1] = total - side.counts[i]


def _search_zero(sides: list[_Side], sweep: int, grid: int, score) -> None:
    """Grid over the negative side's code budget (the zero code), pieces rescaled."""
    neg, pos = sides
    total, k = sum(neg.counts) + sum(pos.counts), len(neg.counts)
    cur = sum(neg.counts)
    cand = _int_window(cur, k, total - k, max(1, int(total * 0.5 * _SHRINK**-sweep)), grid).long().tolist()
    rows = [(_rescale(neg.counts, n), _rescale(pos.counts, total - n)) for n in cand]
    c = len(rows)
    replace = {t: (torch.tensor(side.fracs, dtype=torch.float64).expand(c, -1).contiguous(),
                   torch.tensor([r[t] for r in rows], dtype=torch.float64)) for t, side in enumerate(sides)}
    best = int(torch.argmin(score(_batch(sides, c, replace))))
    neg.counts, pos.counts = list(rows[best][0]), list(rows[best][1])


def _rescale(counts: list[int], n: int) -> tuple[int, ...]:
    """Scale piece counts to sum to ``n`` (largest remainder, each >= 1)."""
    raw = [max(1.0, c * n / sum(counts)) for c in counts]
    out = [max(1, int(r)) for r in raw]
    order = sorted(range(len(out)), key=lambda j: raw[j] - out[j], reverse=True)
    j = 0
    while sum(out) != n:
        t = order[j % len(out)]
        step = 1 if sum(out) < n else -1
        if out[t] + step >= 1:
            out[t] += step
        j += 1
    return tuple(out)


def _result(sides: list[_Side], symmetric: bool, bits: int, counts, edges) -> PwlqSearchResult:
    neg, pos = sides[0], sides[-1]
    neg_b = tuple(f * neg.m for f in neg.fracs)
    pos_b = tuple(f * pos.m for f in pos.fracs)
    piece_codes = (tuple(neg.counts), tuple(pos.counts))
    zero = 0 if symmetric else qrange(bits, False)[0] + sum(neg.counts)
    cb = pwlq_from_breakpoints(neg_b, pos_b, neg.m, pos.m, bits, piece_codes,
                               extra_negative_code=not symmetric, zero_code=zero)
    levels, bounds = codebook_step_function(cb)
    mse = float(expected_sq_error(levels, counts, edges, bounds))
    uni = float(expected_sq_error(uniform_levels(neg.m, pos.m, bits, symmetric), counts, edges))
    return PwlqSearchResult(cb, mse, uni, neg_b, pos_b, piece_codes, zero)
