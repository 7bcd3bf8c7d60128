"""PWLQ piecewise-affine codebooks: checking them and planning the region GEMM.

A codebook splits the int8 code axis into R <= 8 contiguous regions, given in
ascending order: region r holds codes ``code_lo[r] ..= code_hi[r]`` and decodes
``value = offset[r] + scale[r] * q`` (scale > 0, so values ascend with codes).

The region-GEMM decomposition of PWLQ (Fang et al. 2020, Sec. 4) needs
``Q_r @ W^T`` and ``M_r @ W^T`` per region (``Q_r = q * [q in r]``,
``M_r = [q in r]``). :func:`gemm_plan` merges them into fewer integer GEMMs
("slots"): one per distinct scale (a Q-slot over all regions sharing it) and
one per distinct nonzero ``|offset|`` (an M-slot whose operand is +1 / -1 on
regions with offset +o / -o). Symmetric 8-bit PWLQ (centre 0, tails +-o with
one tail scale) needs 3 slots instead of 6; a uniform codebook (R=1) needs 1,
the cost of a plain W8A8 GEMM.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Sequence, Union

import torch

__all__ = [
    "MAX_REGIONS",
    "Codebook",
    "GemmPlan",
    "check_codebook",
    "check_thresholds",
    "device_floats",
    "gemm_plan",
]

MAX_REGIONS = 8
_CODE_MIN, _CODE_MAX = -128, 127  # int8
_Q_SLOT, _M_SLOT = 1, 0

Values = Union[torch.Tensor, Sequence[float], Sequence[int]]


class Codebook(NamedTuple):
    """Checked codebook: float32-rounded floats and ints, hashable (kernel constexprs)."""

    offsets: tuple[float, ...]
    scales: tuple[float, ...]
    code_lo: tuple[int, ...]
    code_hi: tuple[int, ...]


class GemmPlan(NamedTuple):
    """Integer GEMMs ("slots") of a codebook: ``y = w_scale * sum_j coeff_j * (A_j @ W^T)``.

    ``kinds[j]`` is 1 for a Q-slot (operand ``q`` on the regions in
    ``pos[j]``, else 0) and 0 for an M-slot (operand +1 on ``pos[j]``, -1 on
    ``neg[j]``, else 0); ``pos``/``neg`` are region bitmasks.
    """

    kinds: tuple[int, ...]
    pos: tuple[int, ...]
    neg: tuple[int, ...]
    coeffs: tuple[float, ...]


def check_codebook(offsets: Values, scales: Values, code_lo: Values, code_hi: Values) -> Codebook:
    """Check a codebook given as sequences (checked once, then cached) or tensors
    (copied to the host each call: a sync on CUDA).

    Raises
    ------
    ValueError
        Wrong lengths, R outside [1, 8], non-contiguous or unsorted regions,
        codes outside int8, non-positive scales, non-finite values.
    """
    parts = (offsets, scales, code_lo, code_hi)
    if all(isinstance(p, (tuple, list)) for p in parts):
        return _check_codebook_cached(*(tuple(p) for p in parts))
    return _check_codebook(*parts)


def _check_codebook(offsets: Values, scales: Values, code_lo: Values, code_hi: Values) -> Codebook:
    offs, scs = _floats("offsets", offsets), _floats("scales", scales)
    lo, hi = _ints("code_lo", code_lo), _ints("code_hi", code_hi)
    r = len(scs)
    if not 1 <= r <= MAX_REGIONS or {len(offs), len(lo), len(hi)} != {r}:
        raise ValueError(
            f"offsets, scales, code_lo, code_hi must all have the same length R in [1, {MAX_REGIONS}], "
            f"got {len(offs)}, {r}, {len(lo)}, {len(hi)}"
        )
    if any(s <= 0.0 for s in scs):
        raise ValueError(f"scales must be positive, got {scs}")
    if lo[0] < _CODE_MIN or hi[-1] > _CODE_MAX or any(a > b for a, b in zip(lo, hi)):
        raise ValueError(f"regions must satisfy {_CODE_MIN} <= code_lo[r] <= code_hi[r] <= {_CODE_MAX}, got {lo}, {hi}")
    gaps = [i for i in range(r - 1) if lo[i + 1] != hi[i] + 1]
    if gaps:
        raise ValueError(
            f"regions must be contiguous and ascending (code_lo[r+1] == code_hi[r] + 1), broken after region "
            f"{gaps[0]}: code_lo={lo}, code_hi={hi}"
        )
    return Codebook(offs, scs, lo, hi)


_check_codebook_cached = functools.lru_cache(maxsize=256)(_check_codebook)


def check_thresholds(values: Values, n_regions: int) -> tuple[float, ...]:
    """Check the ``R-1`` value-axis thresholds: finite and ascending (ties leave a region empty)."""
    thr = _floats("thresholds", values)
    if len(thr) != n_regions - 1:
        raise ValueError(f"thresholds must have R-1 = {n_regions - 1} values, got {len(thr)}")
    if any(b < a for a, b in zip(thr, thr[1:])):
        raise ValueError(f"thresholds must be ascending, got {thr}")
    return thr


def gemm_plan(book: Codebook) -> GemmPlan:
    """Merge regions into slots: one per distinct scale, one per distinct nonzero |offset|."""
    kinds, pos, neg, coeffs = [], [], [], []
    for scale in dict.fromkeys(book.scales):
        kinds.append(_Q_SLOT)
        pos.append(_mask(r for r, s in enumerate(book.scales) if s == scale))
        neg.append(0)
        coeffs.append(scale)
    for size in dict.fromkeys(abs(o) for o in book.offsets if o != 0.0):
        kinds.append(_M_SLOT)
        pos.append(_mask(r for r, o in enumerate(book.offsets) if o == size))
        neg.append(_mask(r for r, o in enumerate(book.offsets) if o == -size))
        coeffs.append(size)
    return GemmPlan(tuple(kinds), tuple(pos), tuple(neg), tuple(coeffs))


@functools.lru_cache(maxsize=1024)
def device_floats(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """A cached float32 tensor of ``values`` on ``device`` (no host-to-device copy per call)."""
    return torch.tensor(values, dtype=torch.float32, device=device)


def _mask(regions) -> int:
    return sum(1 << r for r in regions)


def _floats(name: str, values: Values) -> tuple[float, ...]:
    """Values as float32-rounded Python floats (the kernels compute in float32)."""
    try:
        t = torch.as_tensor(values.detach().cpu() if isinstance(values, torch.Tensor) else values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{name} must be a 1-D tensor or sequence of numbers, got {values!r}") from e
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    out = tuple(t.to(torch.float32).tolist())
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be finite in float32, got {out}")
    return out


def _ints(name: str, values: Values) -> tuple[int, ...]:
    floats = _floats(name, values)
    if any(v != int(v) for v in floats):
        raise ValueError(f"{name} must hold integers (codes), got {floats}")
    return tuple(int(v) for v in floats)
