"""Input checks shared by the kernel wrappers: one clear ``ValueError`` per mistake.

Every check names the argument, what it got and how to fix it. Inputs are
never copied silently: the kernels take strides, so non-contiguous views are
fine everywhere (see each wrapper's docstring).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = [
    "FLOAT_DTYPES",
    "MAX_BITS",
    "MIN_BITS",
    "check_float_matrix",
    "check_int_matrix",
    "check_out_dtype",
    "check_row_param",
    "check_same_device",
    "check_vector",
    "code_range",
]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_BITS = 2
MAX_BITS = 8  # codes are stored in int8
# Element offsets are computed in int32 inside the kernels.
_MAX_NUMEL = 2**31 - 1


def code_range(bits: int, symmetric: bool) -> tuple[int, int]:
    """Integer code range ``(qmin, qmax)`` of ``bits``-bit codes.

    Symmetric codes drop the most negative value so the range is
    ``[-(2^(b-1)-1), 2^(b-1)-1]``; asymmetric codes use ``[-2^(b-1), 2^(b-1)-1]``.
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits={bits!r} must be an int in [{MIN_BITS}, {MAX_BITS}] (codes are stored in int8)")
    qmax = 2 ** (bits - 1) - 1
    return (-qmax if symmetric else -qmax - 1), qmax


def _require_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    span = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()) if size > 0)
    if t.numel() > _MAX_NUMEL or span > _MAX_NUMEL:
        raise ValueError(
            f"{name} spans {max(t.numel(), span + 1)} elements; the kernels index with int32: "
            "split it (or make a strided view contiguous) below 2^31"
        )
    return t


def check_int_matrix(name: str, t: object, dtype: torch.dtype = torch.int8) -> torch.Tensor:
    """``t`` must be a 2-D tensor of ``dtype`` (codes); returns it."""
    t = _require_tensor(name, t)
    if t.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {t.dtype}; quantize it first (or .view({dtype}))")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}; reshape to (-1, last_dim)")
    return t


def check_float_matrix(name: str, t: object) -> torch.Tensor:
    """``t`` must be a 2-D fp16/bf16/fp32 tensor; returns it."""
    t = _require_tensor(name, t)
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}; reshape to (-1, last_dim)")
    return t


def check_vector(name: str, t: object, length: int, dtype: Optional[torch.dtype]) -> torch.Tensor:
    """``t`` must be 1-D of ``length`` (and ``dtype`` unless None, then any float dtype)."""
    t = _require_tensor(name, t)
    if dtype is None:
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    elif t.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {t.dtype}; convert it with .to({dtype})")
    if tuple(t.shape) != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {tuple(t.shape)}")
    return t


def check_row_param(name: str, t: object, rows: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """A per-tensor (0-d or ``[1]``) or per-row (``[rows]``) parameter.

    Returns ``(t, stride)`` where ``stride`` is 0 for a per-tensor value, so
    the kernels read ``t[m * stride]`` for both cases without a flag.
    """
    t = _require_tensor(name, t)
    if t.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {t.dtype}; convert it with .to({dtype})")
    if t.dim() == 0 or tuple(t.shape) == (1,):
        return t, 0
    if tuple(t.shape) == (rows,):
        return t, t.stride(0)
    raise ValueError(f"{name} must be a scalar tensor (per-tensor) or have shape ({rows},) (per-row), got "
                     f"{tuple(t.shape)}")


def check_same_device(**tensors: Optional[torch.Tensor]) -> torch.device:
    """All given tensors must live on one device (non-tensors are checked elsewhere); returns it."""
    present = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    devices = {v.device for v in present.values()}
    if len(devices) > 1:
        where = ", ".join(f"{k} on {v.device}" for k, v in present.items())
        raise ValueError(f"all tensors must be on one device, got {where}; move them with .to(device)")
    return next(iter(devices))


def check_out_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """``out_dtype`` must be one of fp16, bf16, fp32."""
    if out_dtype not in FLOAT_DTYPES:
        raise ValueError(f"out_dtype={out_dtype} must be torch.float16, torch.bfloat16 or torch.float32")
    return out_dtype
