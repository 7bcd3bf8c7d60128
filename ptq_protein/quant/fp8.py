"""FP8 (E4M3 / E5M2) scaled quantization, simulated exactly with torch's float8 dtypes.

Convention (as in torchao / ModelOpt / ``torch._scaled_mm``): a code is
``float8(x / scale)`` saturated to the format's largest finite value, and it
decodes to ``float32(code) * scale``. The scale maps the calibrated (or run-time)
absolute maximum onto the format's maximum, ``scale = amax / FP8_MAX``, floored at
:data:`~ptq_protein.quant.uniform.SCALE_FLOOR`. The cast to ``torch.float8_*``
rounds to nearest even, so the simulation is the hardware's rounding, not a model
of it. NaN stays NaN (E4M3FN has a NaN encoding; E5M2 too); Inf saturates.

Example
-------
>>> x = torch.tensor([0.0, 1.0, -3.0, 1000.0])
>>> scale = fp8_scale(torch.tensor(448.0), "e4m3")
>>> fp8_fake_quantize(x, scale, "e4m3").tolist()
[0.0, 1.0, -3.0, 448.0]
"""

from __future__ import annotations

from typing import Any

import torch

from ptq_protein.quant.uniform import SCALE_FLOOR

__all__ = ["FP8_DTYPES", "fp8_dtype", "fp8_max", "fp8_scale", "fp8_quantize", "fp8_dequantize", "fp8_fake_quantize",
           "fp8_per_token"]

#: format name -> torch dtype (the "fn" E4M3 variant: no infinities, max 448, as on Hopper/Ada)
FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

FormatArg = Any  # "e4m3" / "e5m2", or the config's FP8Format


def fp8_dtype(fmt: FormatArg) -> torch.dtype:
    """The torch dtype of ``fmt`` (``"e4m3"`` / ``"e5m2"`` or the config enum)."""
    key = getattr(fmt, "value", fmt)
    if key not in FP8_DTYPES:
        raise ValueError(f"unknown FP8 format {fmt!r}; choose one of: {', '.join(FP8_DTYPES)}")
    return FP8_DTYPES[key]


def fp8_max(fmt: FormatArg) -> float:
    """Largest finite value of the format (448 for E4M3FN, 57344 for E5M2)."""
    return float(torch.finfo(fp8_dtype(fmt)).max)


def fp8_scale(amax: torch.Tensor, fmt: FormatArg) -> torch.Tensor:
    """float32 scale mapping ``amax`` (any shape) onto the format's maximum."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("FP8 scale from a non-finite absolute maximum: the calibration saw NaN/Inf")
    return (amax.abs() / fp8_max(fmt)).clamp_min(SCALE_FLOOR)


def fp8_quantize(x: torch.Tensor, scale: torch.Tensor, fmt: FormatArg) -> torch.Tensor:
    """FP8 codes of ``x``: ``float8(clamp(x / scale, -max, max))``; scale broadcasts against x."""
    limit = fp8_max(fmt)
    y = x.to(torch.float32) / scale.to(torch.float32)
    return y.clamp(-limit, limit).to(fp8_dtype(fmt))  # clamp keeps NaN; saturates +-Inf


def fp8_dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of FP8 ``codes``."""
    return codes.to(torch.float32) * scale.to(torch.float32)


def fp8_fake_quantize(x: torch.Tensor, scale: torch.Tensor, fmt: FormatArg) -> torch.Tensor:
    """``fp8_dequantize(fp8_quantize(x))`` in x's dtype."""
    return fp8_dequantize(fp8_quantize(x, scale, fmt), scale).to(x.dtype)


def fp8_per_token(x: torch.Tensor, fmt: FormatArg) -> tuple:
    """Dynamic per-token (last-dim row) FP8: ``(codes, scale [..., 1])``."""
    amax = x.detach().abs().float().nan_to_num(0.0, posinf=0.0, neginf=0.0).amax(dim=-1, keepdim=True)
    scale = (amax / fp8_max(fmt)).clamp_min(SCALE_FLOOR)
    return fp8_quantize(x, scale, fmt), scale
