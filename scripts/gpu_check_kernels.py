"""gpu_check step 2: every kernel on one GEMM shape, exact against the integer reference, then timed.

Exactness compares the kernel (``backend="triton"``) with the exact torch
reference (``backend="torch"``, :mod:`ptq_protein.kernels.reference`) by
``torch.equal``:

* ``int8 acc``: raw int32 accumulators of full-range int8 codes (the reference
  is ``torch._int_mm`` on CUDA, a float64 product on CPU);
* ``w8a8``, ``w4a8``, ``pwlq``: the fused kernels on an *integer probe*: unit
  scales, integer zero points, biases and codebook coefficients, float32 output,
  and weight codes small enough that every partial sum stays below 2^24, so
  float32 represents every epilogue value exactly and the outputs must be equal;
* ``quant``, ``pwlq enc``: activation codes (and per-token scales) of the
  encoding kernels, bit for bit.

FP8 (``torch._scaled_mm``, float accumulation) is not exact by design: its row
gives the largest error relative to the largest float64 output. Timing reuses
``bench_kernels.gemm_row`` (``triton.testing.do_bench`` medians on CUDA).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Dict

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench.kernels import Case, gemm_row  # noqa: E402  (sibling script: the shapes and the timed implementations)

# Integer probe: |acc| <= 128 * W_MAX * K must stay below 2^24 (float32's exact integers) for K <= 10240.
_INT4_W = (-8, 7)  # 128 * 8 * 10240 = 10.5M
_PWLQ_W = (-4, 3)  # (64 + 2 * 127 + 64) * 4 * 10240 = 15.6M over the three slots of the probe codebook
# Symmetric three-region probe codebook: centre scale 1, tails scale 2 around +-64 (PWLQ's slot structure).
_PROBE_BOOK = {"offsets": (-64.0, 0.0, 64.0), "scales": (2.0, 1.0, 2.0), "code_lo": (-127, -63, 64),
               "code_hi": (-64, 63, 127)}
_ENCODE_BOOK = {"thresholds": (-1.0, 1.0), "offsets": (-0.75, 0.0, 0.75), "scales": (1 / 32, 1 / 64, 1 / 32),
                "code_lo": (-127, -64, 65), "code_hi": (-65, 64, 127)}
FP8_TOLERANCE = 1e-4  # float32 accumulation over K <= 10240 of exactly representable products


def check_case(case: Case, device: torch.device, timed: bool) -> dict:
    """Exactness of every kernel on ``case``, then (``timed``) the median ms of every implementation."""
    row = {"model": case.model, "layer": case.layer, "m": case.m, "k": case.k, "n": case.n}
    row["exact"], row["errors"] = {}, {}
    gen = torch.Generator(device=device).manual_seed(case.m * 7 + case.k * 3 + case.n)
    for name, check in _CHECKS.items():
        try:
            row["exact"][name] = bool(check(case, device, gen))
        except Exception as e:  # a failing kernel is a row, not the end of the run
            row["exact"][name] = False
            row["errors"][name] = f"{type(e).__name__}: {str(e)[:200]}"
    try:
        err = _fp8_error(case, device, gen)
        row["fp8_max_rel_err"], row["fp8_within_tolerance"] = err, None if err is None else err <= FP8_TOLERANCE
    except Exception as e:
        row["fp8_max_rel_err"], row["fp8_within_tolerance"] = f"error: {type(e).__name__}: {str(e)[:120]}", False
    if timed:
        row["ms"] = gemm_row(case, device, device.type == "cuda")
    return row


def _codes(gen: torch.Generator, shape, lo: int, hi: int, device) -> torch.Tensor:
    return torch.randint(lo, hi + 1, tuple(shape), dtype=torch.int8, device=device, generator=gen)


def _both(fn: Callable[[str], torch.Tensor]) -> bool:
    """The kernel equals the reference bit for bit (and came back with the same dtype and shape)."""
    got, want = fn("triton"), fn("torch")
    return got.dtype == want.dtype and torch.equal(got, want)


def _int8_accumulators(case: Case, device, gen) -> bool:
    from ptq_protein.kernels import int8_matmul_int32

    a, b = _codes(gen, (case.m, case.k), -128, 127, device), _codes(gen, (case.n, case.k), -128, 127, device)
    return _both(lambda backend: int8_matmul_int32(a, b, backend=backend))


def _probe_epilogue(case: Case, device, gen) -> Dict[str, torch.Tensor]:
    """Unit activation scales, integer zero points and bias: every epilogue value is an exact float32 integer."""
    return {"x_q": _codes(gen, (case.m, case.k), -128, 127, device),
            "x_scale": torch.ones(case.m, device=device), "w_scale": torch.ones(case.n, device=device),
            "x_zero": _codes(gen, (case.m,), -8, 7, device).to(torch.int32),
            "bias": _codes(gen, (case.n,), -100, 100, device).float()}


def _w8a8_probe(case: Case, device, gen) -> bool:
    from ptq_protein.kernels import int8_linear

    p = _probe_epilogue(case, device, gen)
    w_q = _codes(gen, (case.n, case.k), *_INT4_W, device)
    return _both(lambda backend: int8_linear(p["x_q"], p["x_scale"], p["x_zero"], w_q, p["w_scale"], p["bias"],
                                             out_dtype=torch.float32, backend=backend))


def _w4a8_probe(case: Case, device, gen) -> bool:
    from ptq_protein.kernels import int4_linear, pack_int4

    p = _probe_epilogue(case, device, gen)
    packed = pack_int4(_codes(gen, (case.n, case.k), *_INT4_W, device))
    return _both(lambda backend: int4_linear(p["x_q"], p["x_scale"], p["x_zero"], packed, p["w_scale"], case.k,
                                             p["bias"], out_dtype=torch.float32, backend=backend))


def _pwlq_probe(case: Case, device, gen) -> bool:
    from ptq_protein.kernels import pwlq_linear

    x = _codes(gen, (case.m, case.k), -127, 127, device)
    w_q = _codes(gen, (case.n, case.k), *_PWLQ_W, device)
    bias = _codes(gen, (case.n,), -100, 100, device).float()
    ones = torch.ones(case.n, device=device)
    return _both(lambda backend: pwlq_linear(x, **_PROBE_BOOK, w_q=w_q, w_scale=ones, bias=bias,
                                             out_dtype=torch.float32, backend=backend))


def _activations(case: Case, device, gen) -> torch.Tensor:
    """bf16 activations with a few large outliers, as ESM layers have."""
    x = torch.randn(case.m, case.k, device=device, generator=gen)
    x[:, :: max(1, case.k // 4)] *= 20.0
    return x.to(torch.bfloat16)


def _quantize_per_token(case: Case, device, gen) -> bool:
    from ptq_protein.kernels import quantize_per_token

    x = _activations(case, device, gen)
    runs = {b: quantize_per_token(x, symmetric=False, backend=b) for b in ("triton", "torch")}
    return all(torch.equal(g, w) for g, w in zip(runs["triton"], runs["torch"]))


def _pwlq_encode(case: Case, device, gen) -> bool:
    from ptq_protein.kernels import pwlq_quantize

    x = _activations(case, device, gen)
    return _both(lambda backend: pwlq_quantize(x, **_ENCODE_BOOK, backend=backend))


def _fp8_error(case: Case, device, gen):
    """Largest |fp8_linear - float64 product of the decoded codes| / its largest |value|; None where FP8 cannot run."""
    from ptq_protein.kernels import fp8_gemm_supported, fp8_linear
    from ptq_protein.quant.fp8 import fp8_per_token, fp8_quantize, fp8_scale

    if not fp8_gemm_supported(device) or (device.type == "cuda" and (case.k % 16 or case.n % 16)):
        return None  # cuBLASLt's rule; the CPU path takes any shape
    x = torch.randn(case.m, case.k, device=device, generator=gen)
    w = torch.randn(case.n, case.k, device=device, generator=gen) * 0.02
    x8, x_s = fp8_per_token(x, "e4m3")
    w_s = fp8_scale(w.abs().amax(1), "e4m3")
    w8 = fp8_quantize(w, w_s[:, None], "e4m3")
    y = fp8_linear(x8, x_s, w8, w_s, out_dtype=torch.float32).double()
    ref = (x8.double() * x_s.double().reshape(-1, 1)) @ (w8.double() * w_s.double().reshape(-1, 1)).t()
    return float((y - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


_CHECKS = {
    "int8 acc": _int8_accumulators,
    "w8a8": _w8a8_probe,
    "w4a8": _w4a8_probe,
    "pwlq": _pwlq_probe,
    "quant": _quantize_per_token,
    "pwlq enc": _pwlq_encode,
}
