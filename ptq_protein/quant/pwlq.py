"""PWLQ codebook builders (Fang et al., ECCV 2020) on ONE ``bits``-bit code.

Each side of zero is split by breakpoints into pieces, each a uniform grid with
its own step; the pieces share the side's codes (all within the stated bit
width): the total code space here is exactly ``2^bits``. The study's activation
PWLQ (pwlq-3, :mod:`ptq_protein.quant.study`) is different: a ``b``-bit centre grid
over ``[-p, p]`` plus a ``b``-bit tail grid over the whole ``[-M, M]``, i.e. two
full ``b``-bit codes and a region flag, ``b + 1`` bits per value.

Value 0 sits on the zero code ``z`` (default 0). Positive side, knots
``0 = v_0 < v_1 < ... < v_K = m_pos`` and code counts ``n_1..n_K`` (summing to
``qmax - z``, ``qmax = 2^(bits-1) - 1``): piece ``j`` owns codes
``z + c_{j-1}+1 .. z + c_j`` (``c_j = n_1 + ... + n_j``) and decodes
``v_{j-1} + (q - z - c_{j-1}) * (v_j - v_{j-1}) / n_j``. The negative side mirrors
this on codes ``z - 1, z - 2, ...`` down to ``-qmax`` (symmetric restricted range)
or ``-2^(bits-1)`` (the extra code). With ``z = 0`` code 0 decodes to exactly 0;
a non-zero ``z`` (asymmetric data such as GELU outputs, where the negative side
needs few codes) decodes ``z`` to 0 up to float32 rounding of ``offset + scale * z``.
Two innermost pieces with the same step are merged into one centre region, so
:func:`symmetric_pwlq` has 3 regions.
Encoding thresholds sit midway between adjacent regions' boundary levels, which
makes the encoder round to the nearest level everywhere (the paper splits at the
breakpoint itself, which can send a value one tail step away; the midpoint is
never worse).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ptq_protein.quant.codebook import PiecewiseCodebook, round_f32
from ptq_protein.quant.uniform import qrange

__all__ = [
    "MAX_BREAKPOINTS",
    "symmetric_pwlq",
    "asymmetric_pwlq",
    "pwlq_from_breakpoints",
    "default_piece_codes",
    "side_affine",
    "shared_centre_step",
]

MAX_BREAKPOINTS = 3  # per side; a codebook then has at most 8 regions (kernel limit)


def symmetric_pwlq(m: float, p: float, bits: int, center_codes: int | None = None) -> PiecewiseCodebook:
    """One breakpoint ``p`` per side: centre ``[-p, p]`` and tails ``(p, m]``.

    Parameters
    ----------
    m : float
        Range ``max|x|``; ``0 < p < m``.
    p : float
        Breakpoint.
    bits : int
        Total code width (2 is too small: each side needs 2 codes).
    center_codes : int, optional
        Positive codes given to the centre (default ``ceil(qmax / 2)``, e.g. 64 of
        127 at 8 bits: centre step ``p / 64``, tail step ``(m - p) / 63``).

    Returns
    -------
    PiecewiseCodebook with 3 regions on codes ``[-qmax, qmax]``.
    """
    counts = _split_codes(qrange(bits, True)[1], 2, center_codes)
    return pwlq_from_breakpoints([p], [p], m, m, bits, (counts, counts), extra_negative_code=False)


def asymmetric_pwlq(
    m_neg: float,
    p_neg: float,
    m_pos: float,
    p_pos: float,
    bits: int,
    center_codes: tuple[int, int] | None = None,
    zero_code: int = 0,
) -> PiecewiseCodebook:
    """One breakpoint per side with separate ranges; uses the extra code ``-2^(bits-1)``.

    ``m_neg``/``p_neg`` are magnitudes (the negative range is ``[-m_neg, 0]``).
    ``center_codes = (neg, pos)`` gives the inner piece's code count on each side
    (default half of the side's codes, rounded up). ``zero_code`` moves codes
    between the sides: the negative side gets ``zero_code + 2^(bits-1)`` codes.
    """
    qmin, qmax = qrange(bits, False)
    neg_c, pos_c = center_codes if center_codes is not None else (None, None)
    counts = (_split_codes(zero_code - qmin, 2, neg_c), _split_codes(qmax - zero_code, 2, pos_c))
    return pwlq_from_breakpoints([p_neg], [p_pos], m_neg, m_pos, bits, counts, True, zero_code)


def pwlq_from_breakpoints(
    neg_breaks: Sequence[float],
    pos_breaks: Sequence[float],
    m_neg: float,
    m_pos: float,
    bits: int,
    codes_per_piece: tuple[Sequence[int], Sequence[int]] | None = None,
    extra_negative_code: bool | None = None,
    zero_code: int = 0,
) -> PiecewiseCodebook:
    """General PWLQ codebook with 0..3 breakpoints per side.

    Parameters
    ----------
    neg_breaks, pos_breaks : sequence of float
        Breakpoint magnitudes on each side, strictly increasing, inside ``(0, m)``.
    m_neg, m_pos : float
        Range magnitudes (``x`` in ``[-m_neg, m_pos]``), both ``> 0``.
    bits : int
        Total code width.
    codes_per_piece : (neg_counts, pos_counts), optional
        Codes per piece, innermost first; the sides must sum to their code counts
        (see ``zero_code``). Default: :func:`default_piece_codes`.
    extra_negative_code : bool, optional
        Give the negative side code ``-2^(bits-1)``. Default: only when the two
        sides differ (mirror-image sides keep the symmetric restricted range).
    zero_code : int
        Code of value 0. The positive side gets ``qmax - zero_code`` codes, the
        negative side ``zero_code + qmax`` (``+ 1`` with the extra code).

    Returns
    -------
    PiecewiseCodebook
    """
    neg_k, pos_k = _knots(neg_breaks, m_neg, "negative"), _knots(pos_breaks, m_pos, "positive")
    if extra_negative_code is None:
        extra_negative_code = neg_k != pos_k
    qmax = qrange(bits, True)[1]
    if isinstance(zero_code, bool) or not isinstance(zero_code, int):
        raise ValueError(f"zero_code={zero_code!r} must be an integer code")
    n_neg, n_pos = zero_code + qmax + int(bool(extra_negative_code)), qmax - zero_code
    if n_neg < len(neg_k) - 1 or n_pos < len(pos_k) - 1:
        raise ValueError(
            f"zero_code={zero_code!r} leaves {n_neg} negative and {n_pos} positive codes; each side "
            f"needs at least one code per piece ({len(neg_k) - 1} and {len(pos_k) - 1})"
        )
    if codes_per_piece is None:
        codes_per_piece = (default_piece_codes(n_neg, len(neg_k) - 1), default_piece_codes(n_pos, len(pos_k) - 1))
    neg_c = _check_counts(codes_per_piece[0], n_neg, len(neg_k) - 1, "negative")
    pos_c = _check_counts(codes_per_piece[1], n_pos, len(pos_k) - 1, "positive")
    pieces = _side_pieces(neg_k, neg_c, zero_code, negative=True)[::-1]
    pieces += _side_pieces(pos_k, pos_c, zero_code, negative=False)
    return _codebook_from_pieces(_merge_centre(pieces, zero_code), bits)


def shared_centre_step(neg_breaks: Sequence[float], pos_breaks: Sequence[float], m_neg: float, m_pos: float,
                       bits: int, codes_per_piece: tuple[Sequence[int], Sequence[int]],
                       zero_code: int) -> PiecewiseCodebook:
    """An asymmetric codebook whose two centre pieces share one step, so they merge into one region.

    The integer-friendly PWLQ: codes in the centre then decode as one uniform grid with an integer zero point
    (one dense integer GEMM; only the tails need a correction). The step is the pooled one,
    ``(p_neg + p_pos) / (n_neg + n_pos)``, rounded to float32 so that both pieces decode identically; the
    centre breakpoints move to ``step * n`` (the code counts stay). Where that would pass a side's next knot,
    the smaller of the two steps is taken (both breakpoints move inwards).
    """
    n_neg, n_pos = codes_per_piece[0][0], codes_per_piece[1][0]
    outer_neg = neg_breaks[1] if len(neg_breaks) > 1 else m_neg
    outer_pos = pos_breaks[1] if len(pos_breaks) > 1 else m_pos
    step = round_f32([(neg_breaks[0] + pos_breaks[0]) / (n_neg + n_pos)])[0]
    if step * n_neg >= outer_neg or step * n_pos >= outer_pos:
        step = round_f32([min(neg_breaks[0] / n_neg, pos_breaks[0] / n_pos)])[0]
    return pwlq_from_breakpoints((step * n_neg, *neg_breaks[1:]), (step * n_pos, *pos_breaks[1:]), m_neg, m_pos,
                                 bits, codes_per_piece, extra_negative_code=True, zero_code=zero_code)


def default_piece_codes(n_codes: int, n_pieces: int) -> tuple[int, ...]:
    """Equal split of a side's codes over its pieces, remainder to the innermost."""
    if n_pieces < 1 or n_codes < n_pieces:
        raise ValueError(f"cannot split {n_codes} codes into {n_pieces} pieces (need >= 1 code each)")
    base, extra = divmod(n_codes, n_pieces)
    return tuple(base + (1 if j < extra else 0) for j in range(n_pieces))


def side_affine(knots: torch.Tensor, counts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-piece decode ``(offset, scale)`` of one side, in magnitude units.

    ``knots`` is ``[..., K+1]`` (``0, breaks..., m``), ``counts`` the ``K`` piece
    code counts; piece ``j`` decodes magnitude ``offset[j] + scale[j] * c`` for its
    codes ``c`` (``c >= 1`` counted outward from 0). Batched over leading dims, so
    the breakpoint search shares this exact formula with the builders.
    """
    n = torch.as_tensor(counts, dtype=knots.dtype, device=knots.device)
    before = torch.cumsum(n, -1) - n
    scale = (knots[..., 1:] - knots[..., :-1]) / n
    return knots[..., :-1] - before * scale, scale


def _split_codes(n_codes: int, n_pieces: int, inner: int | None) -> tuple[int, ...]:
    if inner is None:
        return default_piece_codes(n_codes, n_pieces)
    if not 1 <= inner <= n_codes - 1:
        raise ValueError(f"center_codes={inner} must be in [1, {n_codes - 1}] for {n_codes} side codes")
    return (int(inner), n_codes - int(inner))


def _knots(breaks: Sequence[float], m: float, side: str) -> tuple[float, ...]:
    breaks = tuple(float(b) for b in breaks)
    if len(breaks) > MAX_BREAKPOINTS:
        raise ValueError(f"{len(breaks)} {side} breakpoints given; at most {MAX_BREAKPOINTS} are supported")
    knots = (0.0, *breaks, float(m))
    if not all(math.isfinite(v) for v in knots) or any(b <= a for a, b in zip(knots, knots[1:])):
        raise ValueError(
            f"{side} side needs 0 < breakpoints < m strictly increasing and finite, got "
            f"breaks={list(breaks)}, m={m}"
        )
    return knots


def _check_counts(counts: Sequence[int], n_codes: int, n_pieces: int, side: str) -> tuple[int, ...]:
    counts = tuple(int(c) for c in counts)
    if len(counts) != n_pieces or any(c < 1 for c in counts) or sum(counts) != n_codes:
        raise ValueError(
            f"{side} codes_per_piece={list(counts)} must have {n_pieces} positive entries "
            f"summing to {n_codes}"
        )
    return counts


def _side_pieces(knots: tuple[float, ...], counts: tuple[int, ...], z: int, negative: bool) -> list[tuple]:
    """(code_lo, code_hi, offset, scale) per piece, innermost first."""
    off, sc = side_affine(torch.tensor(knots, dtype=torch.float64), counts)
    pieces, start, end = [], 1 if negative else 0, 0
    for j, n in enumerate(counts):
        end += n
        o, s = float(off[j]), float(sc[j])
        if negative:  # value = -(o + s * (z - q)) = (-o - s z) + s q
            pieces.append((z - end, z - start, -o - s * z, s))
        else:  # value = o + s * (q - z)
            pieces.append((z + start, z + end, o - s * z, s))
        start = end + 1
    return pieces


def _merge_centre(pieces: list[tuple], z: int) -> list[tuple]:
    """Merge the two pieces meeting at the zero code when their float32 decodes agree."""
    i = next(k for k, pc in enumerate(pieces) if pc[0] == z)
    if i == 0:
        return pieces
    a, b = pieces[i - 1], pieces[i]
    if round_f32([a[2], a[3]]) != round_f32([b[2], b[3]]):
        return pieces
    return pieces[: i - 1] + [(a[0], b[1], b[2], b[3])] + pieces[i + 1:]


def _codebook_from_pieces(pieces: list[tuple], bits: int) -> PiecewiseCodebook:
    lo, hi, off, sc = (tuple(col) for col in zip(*pieces))
    off32, sc32 = round_f32(off), round_f32(sc)
    if any(s <= 0 for s in sc32):
        raise ValueError("a piece is narrower than float32 resolution; widen the breakpoint spacing")
    top = [off32[r] + sc32[r] * hi[r] for r in range(len(pieces) - 1)]
    bottom = [off32[r + 1] + sc32[r + 1] * lo[r + 1] for r in range(len(pieces) - 1)]
    thresholds = tuple(0.5 * (a + b) for a, b in zip(top, bottom))
    return PiecewiseCodebook(bits, lo, hi, off, sc, thresholds)
