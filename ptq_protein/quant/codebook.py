"""Piecewise-affine codebooks: one signed ``bits``-bit code, several linear regions.

Every PWLQ quantizer (Fang et al., "Post-Training Piecewise Linear Quantization
for Deep Neural Networks", ECCV 2020) and the uniform quantizer (one region) is a
:class:`PiecewiseCodebook`. Regions ``r = 0..R-1`` are contiguous, disjoint code
intervals ``[code_lo[r], code_hi[r]]`` sorted along the code axis, decoding as

    ``value = offset[r] + scale[r] * q``,

and ascending value-axis ``thresholds`` (``R - 1`` floats) choose the region when
encoding: region ``r`` takes ``x`` in ``[thr[r-1], thr[r])``, then

    ``q = clamp(round((x - offset[r]) / scale[r]), code_lo[r], code_hi[r])``.

All parameters are stored as float32-representable numbers, and encoding runs in
float32 with a true division, so the Triton kernels (which get the float32/int32
tensors from the accessors) reproduce the codes exactly. Non-finite inputs follow
the uniform convention: ``+-Inf`` clamp to the end codes, NaN encodes like 0
(code 0 for every builder here, since integer codes cannot hold NaN), and
:func:`pwlq_fake_quantize` propagates NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ptq_protein.quant.uniform import check_bits, code_dtype, qrange

__all__ = [
    "CODEBOOK_FORMAT_VERSION",
    "PiecewiseCodebook",
    "pwlq_quantize",
    "pwlq_dequantize",
    "pwlq_fake_quantize",
    "uniform_codebook",
    "codebook_step_function",
    "round_f32",
]

CODEBOOK_FORMAT_VERSION = 1


def round_f32(values: Sequence[float]) -> tuple[float, ...]:
    """Round to float32 so stored parameters equal what the kernels receive."""
    return tuple(float(v) for v in np.asarray(values, dtype=np.float64).astype(np.float32))


@dataclass(frozen=True)
class PiecewiseCodebook:
    """A piecewise-affine decode table on one signed ``bits``-bit code.

    Attributes
    ----------
    bits : int
        Code width; every code lies in ``[-2^(bits-1), 2^(bits-1) - 1]``.
    code_lo, code_hi : tuple of int, length ``R``
        Inclusive code interval of each region, contiguous and ascending.
    offset, scale : tuple of float, length ``R``
        Decode ``value = offset[r] + scale[r] * q``; ``scale[r] > 0``.
    thresholds : tuple of float, length ``R - 1``
        Ascending value-axis region boundaries used by the encoder.
    """

    bits: int
    code_lo: tuple[int, ...]
    code_hi: tuple[int, ...]
    offset: tuple[float, ...]
    scale: tuple[float, ...]
    thresholds: tuple[float, ...]

    def __post_init__(self) -> None:
        check_bits(self.bits)
        for name in ("code_lo", "code_hi"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        for name in ("offset", "scale", "thresholds"):
            object.__setattr__(self, name, round_f32(getattr(self, name)))
        self._validate()

    def _validate(self) -> None:
        n = len(self.code_lo)
        if n == 0 or not len(self.code_hi) == len(self.offset) == len(self.scale) == n:
            raise ValueError(
                f"codebook needs R >= 1 regions with code_lo, code_hi, offset and scale of "
                f"equal length, got {len(self.code_lo)}, {len(self.code_hi)}, "
                f"{len(self.offset)}, {len(self.scale)}"
            )
        if len(self.thresholds) != n - 1:
            raise ValueError(f"{n} regions need {n - 1} thresholds, got {len(self.thresholds)}")
        qmin, qmax = qrange(self.bits, symmetric=False)
        if self.code_lo[0] < qmin or self.code_hi[-1] > qmax:
            raise ValueError(
                f"codes [{self.code_lo[0]}, {self.code_hi[-1]}] exceed the {self.bits}-bit "
                f"range [{qmin}, {qmax}]"
            )
        for r in range(n):
            if self.code_lo[r] > self.code_hi[r]:
                raise ValueError(f"region {r} is empty: code_lo={self.code_lo[r]} > code_hi={self.code_hi[r]}")
            if r and self.code_lo[r] != self.code_hi[r - 1] + 1:
                raise ValueError(f"regions {r - 1} and {r} are not contiguous on the code axis")
            if not (math.isfinite(self.scale[r]) and self.scale[r] > 0 and math.isfinite(self.offset[r])):
                raise ValueError(f"region {r} needs a finite positive scale and finite offset")
        if any(not math.isfinite(t) for t in self.thresholds) or any(
            b < a for a, b in zip(self.thresholds, self.thresholds[1:])
        ):
            raise ValueError(f"thresholds must be finite and ascending, got {self.thresholds}")
        self._validate_monotone()

    def _validate_monotone(self) -> None:
        """Decoded values (float32 arithmetic) must ascend across region boundaries."""
        off, sc = torch.tensor(self.offset), torch.tensor(self.scale)
        ends = off + sc * torch.tensor(self.code_hi, dtype=torch.float32)
        starts = off + sc * torch.tensor(self.code_lo, dtype=torch.float32)
        bad = (ends[:-1] >= starts[1:]).nonzero().flatten().tolist()
        if bad:
            r = bad[0]
            raise ValueError(
                f"decoded values must increase with the code, but region {r} ends at {float(ends[r])!r} "
                f">= region {r + 1} starting at {float(starts[r + 1])!r}: a side whose range is far below "
                "float32 resolution of the other side's offsets; widen that range"
            )

    @property
    def num_regions(self) -> int:
        return len(self.code_lo)

    @property
    def qmin(self) -> int:
        return self.code_lo[0]

    @property
    def qmax(self) -> int:
        return self.code_hi[-1]

    # Tensors for kernels: float32 / int32, shape [R] (thresholds ).
    def offsets(self, device: torch.device | str | None = None) -> torch.Tensor:
        return torch.tensor(self.offset, dtype=torch.float32, device=device)

    def scales(self, device: torch.device | str | None = None) -> torch.Tensor:
        return torch.tensor(self.scale, dtype=torch.float32, device=device)

    def code_lo_tensor(self, device: torch.device | str | None = None) -> torch.Tensor:
        return torch.tensor(self.code_lo, dtype=torch.int32, device=device)

    def code_hi_tensor(self, device: torch.device | str | None = None) -> torch.Tensor:
        return torch.tensor(self.code_hi, dtype=torch.int32, device=device)

    def thresholds_tensor(self, device: torch.device | str | None = None) -> torch.Tensor:
        return torch.tensor(self.thresholds, dtype=torch.float32, device=device)

    @property
    def zero_code(self) -> int:
        """The code that 0.0 encodes to (what NaN and padding map to)."""
        return int(pwlq_quantize(torch.zeros(1), self)[0])

    def levels(self) -> torch.Tensor:
        """Decoded value of every code ``qmin..qmax`` (float32, ``[qmax - qmin + 1]``)."""
        codes = torch.arange(self.qmin, self.qmax + 1, dtype=torch.int32)
        return pwlq_dequantize(codes, self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": CODEBOOK_FORMAT_VERSION,
            "bits": self.bits,
            "code_lo": list(self.code_lo),
            "code_hi": list(self.code_hi),
            "offset": list(self.offset),
            "scale": list(self.scale),
            "thresholds": list(self.thresholds),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PiecewiseCodebook":
        version = data.get("version")
        if version != CODEBOOK_FORMAT_VERSION:
            raise ValueError(
                f"codebook format version {version!r} is not supported (expected {CODEBOOK_FORMAT_VERSION})"
            )
        keys = ("bits", "code_lo", "code_hi", "offset", "scale", "thresholds")
        missing = [k for k in keys if k not in data]
        if missing:
            raise ValueError(f"codebook dict is missing keys {missing}")
        return cls(**{k: (data[k] if k == "bits" else tuple(data[k])) for k in keys})


def pwlq_quantize(x: torch.Tensor, cb: PiecewiseCodebook) -> torch.Tensor:
    """Encode ``x`` (any shape) to codes of ``code_dtype(cb.bits)``, same shape.

    Region by ``searchsorted(thresholds, x, right=True)``, then round half to even
    and clamp to the region's code interval, in float32 (float64 stays float64).
    """
    xf = x if x.dtype == torch.float64 else x.to(torch.float32)
    dev = x.device
    thr = cb.thresholds_tensor(dev).to(xf.dtype)
    xs = torch.nan_to_num(xf, nan=0.0)
    region = torch.searchsorted(thr, xs.contiguous(), right=True)
    off = cb.offsets(dev).to(xf.dtype)[region]
    sc = cb.scales(dev).to(xf.dtype)[region]
    lo = cb.code_lo_tensor(dev).to(xf.dtype)[region]
    hi = cb.code_hi_tensor(dev).to(xf.dtype)[region]
    q = torch.minimum(torch.maximum(torch.round((xs - off) / sc), lo), hi)
    return q.to(code_dtype(cb.bits))


def pwlq_dequantize(codes: torch.Tensor, cb: PiecewiseCodebook) -> torch.Tensor:
    """Decode integer ``codes`` (any shape) to float32 ``offset[r] + scale[r] * q``."""
    dev = codes.device
    q = codes.to(torch.int32)
    if q.numel() and (int(q.min()) < cb.qmin or int(q.max()) > cb.qmax):
        raise ValueError(f"codes outside the codebook range [{cb.qmin}, {cb.qmax}]")
    region = torch.searchsorted(cb.code_hi_tensor(dev), q.contiguous(), right=False)
    return cb.offsets(dev)[region] + cb.scales(dev)[region] * q.to(torch.float32)


def pwlq_fake_quantize(x: torch.Tensor, cb: PiecewiseCodebook) -> torch.Tensor:
    """``pwlq_dequantize(pwlq_quantize(x))`` in ``x``'s dtype, NaN propagated."""
    out = pwlq_dequantize(pwlq_quantize(x, cb), cb)
    return torch.where(torch.isnan(x), x.to(out.dtype), out).to(x.dtype)


def uniform_codebook(scale: float, zero_point: int, bits: int, symmetric: bool) -> PiecewiseCodebook:
    """The one-region codebook equal to the uniform quantizer ``(scale, zero_point)``."""
    qmin, qmax = qrange(bits, symmetric)
    s = round_f32([scale])[0]
    return PiecewiseCodebook(bits, (qmin,), (qmax,), (-zero_point * s,), (s,), ())


def codebook_step_function(cb: PiecewiseCodebook) -> tuple[torch.Tensor, torch.Tensor]:
    """The encode-decode map as a step function, for exact error integrals.

    Returns ``levels`` (float64 ``[L]``, decoded value of each code in code order)
    and ``bounds`` (float64 ``[L-1]``, non-decreasing): ``x`` in
    ``[bounds[i-1], bounds[i])`` decodes to ``levels[i]``. Inside a region the
    bounds are the rounding midpoints clipped to the region's thresholds.
    """
    levels, bounds = [], []
    thr = [-math.inf, *cb.thresholds, math.inf]
    for r in range(cb.num_regions):
        q = np.arange(cb.code_lo[r], cb.code_hi[r] + 1, dtype=np.float64)
        levels.append(cb.offset[r] + cb.scale[r] * q)
        mids = cb.offset[r] + cb.scale[r] * (q[:-1] + 0.5)
        bounds.append(np.clip(mids, thr[r], thr[r + 1]))
        if r < cb.num_regions - 1:
            bounds.append(np.array([thr[r + 1]]))
    return torch.from_numpy(np.concatenate(levels)), torch.from_numpy(np.concatenate(bounds))
