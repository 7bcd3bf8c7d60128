"""Uniform (affine) quantization: pure tensor functions, modelled on torchao.

Conventions shared with the Triton kernels (``ptq_protein.kernels``):

* ``value = scale * (q - zero_point)``; ``q = clamp(round(x / scale) + zero_point,
  qmin, qmax)`` with ``torch.round`` (round half to even) and a true float32
  division ``x / scale`` (not ``x * (1 / scale)``), so kernels reproduce the codes
  bit for bit.
* Symmetric: restricted range ``[-(2^(b-1) - 1), 2^(b-1) - 1]``, zero point 0.
  Asymmetric: full range ``[-2^(b-1), 2^(b-1) - 1]`` and an integer zero point in it.
* Codes are stored as :func:`code_dtype` (int8 for ``bits <= 8``, int16 up to 16
  bits); zero points are int32, scales float32. Parameters keep the reduced
  dimensions (``keepdim``) so they broadcast against ``x``.
* Scales are floored at :data:`SCALE_FLOOR` so a zero range never yields a zero or
  NaN scale: an all-zero tensor round-trips exactly, a constant ``c`` to within
  one step.
* Quantize-time non-finite values (documented, tested): ``+-Inf`` clamp to
  ``qmax``/``qmin``; ``NaN`` maps to the code of 0 (the zero point) in
  :func:`quantize` because integer codes cannot hold NaN, while
  :func:`fake_quantize` propagates NaN. Calibration-time functions
  (:func:`choose_qparams`) reject non-finite ranges with ``ValueError``.

Example
-------
>>> x = torch.tensor([-1.0, 0.0, 0.5, 1.0])
>>> s, zp = choose_qparams(x.min(), x.max(), bits=8, symmetric=True)
>>> quantize(x, s, zp, bits=8, symmetric=True).tolist()
[-127, 0, 64, 127]
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = [
    "MIN_BITS",
    "MAX_BITS",
    "SCALE_FLOOR",
    "check_bits",
    "qrange",
    "per_token_qparams",
    "code_dtype",
    "choose_qparams",
    "quantize",
    "dequantize",
    "fake_quantize",
    "dynamic_per_token",
    "per_channel_minmax",
]

MIN_BITS = 2  # below 2 bits a signed code has no non-zero symmetric level
MAX_BITS = 16  # codes must fit int16 (and int32 accumulators in the kernels)
# Smallest normal float32: a positive scale that is never 0/denormal, so a zero
# range cannot divide by zero; any real range is far above it.
SCALE_FLOOR = float(torch.finfo(torch.float32).tiny)


def check_bits(bits: int) -> int:
    """Return ``bits`` as an int or raise ``ValueError`` naming the valid range."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(
            f"bits={bits!r} is not supported: use an integer in [{MIN_BITS}, {MAX_BITS}]"
        )
    return bits


def qrange(bits: int, symmetric: bool) -> tuple[int, int]:
    """Integer code range ``(qmin, qmax)`` for a signed ``bits``-bit code.

    Symmetric uses the restricted range ``[-(2^(b-1)-1), 2^(b-1)-1]`` so that
    ``+-max`` map to ``+-qmax``; asymmetric uses the full ``[-2^(b-1), 2^(b-1)-1]``.
    """
    check_bits(bits)
    qmax = 2 ** (bits - 1) - 1
    return (-qmax, qmax) if symmetric else (-qmax - 1, qmax)


def code_dtype(bits: int) -> torch.dtype:
    """Storage dtype of codes: int8 for ``bits <= 8``, int16 for ``bits <= 16``."""
    return torch.int8 if check_bits(bits) <= 8 else torch.int16


def choose_qparams(
    min_val: torch.Tensor | float,
    max_val: torch.Tensor | float,
    bits: int,
    symmetric: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point covering ``[min_val, max_val]`` (elementwise, broadcast).

    Parameters
    ----------
    min_val, max_val : Tensor or float, any (broadcastable) shape ``S``
        Observed range; it is widened to include 0 so that 0 is exactly representable.
    bits : int
        Code width, 2..16.
    symmetric : bool
        ``scale = max(|min|, |max|) / qmax`` and zero point 0, or the affine
        ``scale = (max - min) / (qmax - qmin)`` with ``zp = qmin - round(min / scale)``.

    Returns
    -------
    scale : Tensor ``S``, float32, ``>= SCALE_FLOOR``
    zero_point : Tensor ``S``, int32, within ``qrange(bits, symmetric)``

    Raises
    ------
    ValueError
        If a range value is NaN or infinite (calibration saw non-finite data).
    """
    qmin, qmax = qrange(bits, symmetric)
    lo = torch.as_tensor(min_val, dtype=torch.float64)
    hi = torch.as_tensor(max_val, dtype=torch.float64)
    if not (torch.isfinite(lo).all() and torch.isfinite(hi).all()):
        raise ValueError(
            "choose_qparams got a non-finite range (NaN or Inf in min_val/max_val): "
            "calibrate on finite data"
        )
    lo, hi = torch.clamp(lo, max=0.0), torch.clamp(hi, min=0.0)
    if symmetric:
        scale = (torch.maximum(-lo, hi) / qmax).to(torch.float32).clamp(min=SCALE_FLOOR)
        return scale, torch.zeros_like(scale, dtype=torch.int32)
    scale = ((hi - lo) / (qmax - qmin)).to(torch.float32).clamp(min=SCALE_FLOOR)
    zp = qmin - torch.round(lo / scale.to(torch.float64))
    return scale, zp.clamp(qmin, qmax).to(torch.int32)


def quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    bits: int,
    symmetric: bool,
) -> torch.Tensor:
    """Integer codes ``clamp(round(x / scale) + zero_point, qmin, qmax)``.

    ``x`` (any shape) is computed in float32 (float64 stays float64); ``scale`` and
    ``zero_point`` must broadcast against it. Returns codes of
    :func:`code_dtype` ``(bits)`` with the shape of ``x``. NaN maps to the zero
    point, ``+-Inf`` to ``qmax``/``qmin``.
    """
    qmin, qmax = qrange(bits, symmetric)
    xf = _as_float(x)
    # One temporary (nan_to_num's copy), the rest in place: the swap quantizes every weight of
    # the model with this, and each fresh full-size temporary is a page-faulted allocation.
    q = torch.nan_to_num(xf, nan=0.0)
    shape = torch.broadcast_shapes(q.shape, scale.shape, zero_point.shape)
    if q.shape != shape:  # parameters wider than x: the in-place ops need the broadcast shape
        q = q.expand(shape).clone()
    q.div_(scale.to(xf.dtype)).round_().add_(zero_point.to(xf.dtype))
    return q.clamp_(qmin, qmax).to(code_dtype(bits))


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    """Float32 values ``(codes - zero_point) * scale`` (shape of the broadcast)."""
    return (codes.to(torch.int32) - zero_point.to(torch.int32)).to(torch.float32) * scale.to(
        torch.float32
    )


def fake_quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    bits: int,
    symmetric: bool,
) -> torch.Tensor:
    """``dequantize(quantize(x))`` in ``x``'s dtype, with NaN propagated.

    This is the simulated-quantization path used during evaluation; it returns
    exactly the values a kernel would decode from the same codes.
    """
    out = dequantize(quantize(x, scale, zero_point, bits, symmetric), scale, zero_point)
    out = torch.where(torch.isnan(x), x.to(out.dtype), out)
    return out.to(x.dtype) if x.is_floating_point() else out


def dynamic_per_token(
    x: torch.Tensor, bits: int, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize each row (reduction over the last dim) with its own range.

    Parameters
    ----------
    x : Tensor ``[..., D]``, finite

    Returns
    -------
    codes : Tensor ``[..., D]`` of :func:`code_dtype`
    scale : Tensor ``[..., 1]`` float32
    zero_point : Tensor ``[..., 1]`` int32
    """
    scale, zp = per_token_qparams(x, bits, symmetric)
    return quantize(x, scale, zp, bits, symmetric), scale, zp


def per_token_qparams(x: torch.Tensor, bits: int, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point ``[..., 1]`` of each row's range (the parameters of :func:`dynamic_per_token`).

    ``amin`` and ``amax`` separately: on CPU the fused ``aminmax`` over the last
    dim was six times slower (same values).
    """
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"dynamic_per_token needs a non-empty last dim, got shape {tuple(x.shape)}")
    xf = _as_float(x)
    return choose_qparams(xf.amin(dim=-1, keepdim=True), xf.amax(dim=-1, keepdim=True), bits, symmetric)


def per_channel_minmax(w: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Min and max of ``w`` over every dim except ``axis`` (keepdim, float32).

    For an ``nn.Linear`` weight ``[out, in]`` use ``axis=0`` (one range per output
    channel); the results have shape ``[out, 1]`` and broadcast against ``w``.
    """
    if w.dim() == 0:
        raise ValueError("per_channel_minmax needs at least a 1-D tensor, got a scalar")
    if not -w.dim() <= axis < w.dim():
        raise ValueError(f"axis={axis} is out of range for a {w.dim()}-D tensor of shape {tuple(w.shape)}")
    axis %= w.dim()
    dims: Sequence[int] = [d for d in range(w.dim()) if d != axis]
    wf = _as_float(w)
    if not dims:
        return wf.clone(), wf.clone()
    return wf.amin(dim=dims, keepdim=True), wf.amax(dim=dims, keepdim=True)


def _as_float(x: torch.Tensor) -> torch.Tensor:
    """float32 view of ``x`` unless it is already float64 (kept for references)."""
    return x if x.dtype == torch.float64 else x.to(torch.float32)
