"""Independent references and tolerance checks for the kernel tests.

Everything here is computed from scratch in int64 / float64 on the CPU (never
through ``ptq_protein.kernels.reference``), so the tests compare both backends
against math they do not share. The kernels run on :data:`DEVICE`: CUDA when
present (compiled kernels), else the CPU (Triton interpreter, set up by
tests/conftest.py), so the same suite verifies a GPU when one is there.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# Relative tolerance of the float epilogue per output dtype: float32 math is a
# few ulps (2^-24 each); fp16 / bf16 add one rounding of the output (half an ulp).
EPILOGUE_RTOL = {torch.float32: 1e-6, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
# Smallest fp16 subnormal: the absolute rounding error near zero.
_ATOL = {torch.float32: 1e-30, torch.float16: 2.0**-24, torch.bfloat16: 1e-30}


def dev(*tensors: Optional[torch.Tensor]):
    """The tensors moved to :data:`DEVICE` (None stays None); one tensor comes back bare."""
    moved = tuple(None if t is None else t.to(DEVICE) for t in tensors)
    return moved[0] if len(moved) == 1 else moved


def codes(gen: torch.Generator, shape: Sequence[int], lo: int = -128, hi: int = 127) -> torch.Tensor:
    """Uniform random int8 codes in ``[lo, hi]``."""
    return torch.randint(lo, hi + 1, tuple(shape), dtype=torch.int8, generator=gen)


def exact_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` in int64 (exact)."""
    return a.long() @ b.long().t()


def linear_ref64(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    x_zero: Optional[torch.Tensor],
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 ``x_scale * w_scale * (acc - x_zero * colsum) + bias`` and the magnitude of its terms."""
    m = x_q.shape[0]
    acc = exact_product(x_q, w_q)
    if x_zero is not None:
        acc = acc - x_zero.long().reshape(-1, 1).expand(m, 1) * w_q.long().sum(1)[None, :]
    scaled = acc.double() * x_scale.double().reshape(-1, 1).expand(m, 1) * w_scale.double()[None, :]
    bias64 = torch.zeros_like(scaled) if bias is None else bias.double()[None, :].expand_as(scaled)
    return scaled + bias64, scaled.abs() + bias64.abs()


def assert_epilogue_close(y: torch.Tensor, ref64: torch.Tensor, magnitude: torch.Tensor) -> None:
    """``|y - ref| <= rtol(dtype) * magnitude`` elementwise (magnitude: the terms' absolute sum)."""
    assert y.shape == ref64.shape, (y.shape, ref64.shape)
    err = (y.cpu().double() - ref64).abs()
    bound = EPILOGUE_RTOL[y.dtype] * magnitude + _ATOL[y.dtype]
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{y.dtype}: error reaches {worst:.3g} x the tolerance"


def decode_pwlq(q: torch.Tensor, offsets, scales, code_lo, code_hi) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 decoded values of PWLQ codes and their per-element magnitude ``|offset| + |scale * q|``."""
    value = torch.full(q.shape, float("nan"), dtype=torch.float64)
    magnitude = torch.zeros(q.shape, dtype=torch.float64)
    qf = q.double()
    for off, sc, lo, hi in zip(offsets, scales, code_lo, code_hi):
        inside = (q >= lo) & (q <= hi)
        off64 = float(torch.tensor(off, dtype=torch.float32))
        sc64 = float(torch.tensor(sc, dtype=torch.float32))
        value[inside] = off64 + sc64 * qf[inside]
        magnitude[inside] = abs(off64) + abs(sc64 * qf[inside])
    assert not torch.isnan(value).any(), "codes outside the codebook"
    return value, magnitude


def symmetric_pwlq(breakpoint: float, range_max: float, centre_levels: int = 64) -> dict:
    """Symmetric 8-bit PWLQ codebook of the brief: centre -n..n, tails +-(n+1..127)."""
    n = centre_levels
    s_c, s_t = breakpoint / n, (range_max - breakpoint) / (127 - n)
    o = breakpoint - n * s_t
    return {
        "offsets": [-o, 0.0, o],
        "scales": [s_t, s_c, s_t],
        "code_lo": [-127, -n, n + 1],
        "code_hi": [-n - 1, n, 127],
        "thresholds": [-breakpoint - s_c / 2, breakpoint + s_c / 2],
    }


def asymmetric_pwlq5() -> dict:
    """An asymmetric 5-region codebook over [-128, 127] with distinct scales and offsets."""
    return {
        "offsets": [-3.0, -1.25, 0.0, 0.5, 2.0],
        "scales": [0.125, 0.03125, 0.0078125, 0.015625, 0.0625],
        "code_lo": [-128, -100, -20, 30, 90],
        "code_hi": [-101, -21, 29, 89, 127],
        "thresholds": [-4.3, -0.3, 0.26, 1.9],
    }


def codebook_of(book: dict) -> dict:
    """The codebook keys of ``book`` (without thresholds), as keyword arguments."""
    return {k: book[k] for k in ("offsets", "scales", "code_lo", "code_hi")}
