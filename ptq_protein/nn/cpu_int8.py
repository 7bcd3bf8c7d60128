"""CPU fast path of ``backend="int8"``: oneDNN's int8 GEMM on weights prepacked once.

PyTorch ships oneDNN's quantized linear (``torch.ops.onednn.qlinear_prepack`` /
``qlinear_pointwise``; AVX2, AVX-512 VNNI and AMX kernels chosen by oneDNN at
run time). It multiplies int8 activation codes by the prepacked int8 weight,
accumulates in int32 and applies ``x_scale * w_scale[n] * (acc - x_zero *
colsum[n]) + bias[n]`` in its epilogue, so a static per-tensor site is one call.
No GEMM is written here.

* Static uniform (symmetric or asymmetric): one fused call.
* Dynamic per-token: one call with unit activation scale, then one vectorised
  pass (per-row scale, zero-point correction, bias).
* W4A8: oneDNN has no int4 linear, so 4-bit weight codes (already unpacked to
  int8 in the module) are prepacked as int8: same results, int8 speed and memory.
* PWLQ: :mod:`ptq_protein.nn.cpu_pwlq` (the region decomposition on these GEMMs).

Every integer accumulator equals the exact reference's; the float epilogue
(float32 inside oneDNN) agrees with the float64 reference to ~1e-7 relative.

**AVX2 without VNNI.** oneDNN's u8 x s8 GEMM sums each pair of products into a
saturating int16 there (``255 * 127 * 2`` becomes 32767; CPUs with VNNI or AMX
accumulate in int32 and are exact). The probe (:func:`mode`) finds it once per
process; then every GEMM runs on saturation-free operands
(:mod:`ptq_protein.nn.cpu_int8_split`: one GEMM on a shifted window of codes,
plus a column correction or a second GEMM for the codes outside it), with the
recipe unchanged and the integer accumulators identical to the reference's.
The zero point is not handed to oneDNN there: its zero-point kernel is exact
but about 15x slower on this class of CPU (measured: 210 ms vs 14 ms at
1024 x 480 x 1920, 1 thread).
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple, Optional, Tuple

import torch

from ptq_protein.nn.cpu_int8_split import exact_accumulators, sum_post_op

__all__ = ["ENGINE_NAME", "Packed", "available", "mode", "reason", "prepack", "unpack", "as_u8", "gemm", "gemm_add_",
           "accumulators", "static_linear",
           "per_token_linear", "per_token_epilogue_"]

log = logging.getLogger(__name__)

ENGINE_NAME = "onednn"
# Rows of the activation oneDNN is told to expect when it lays out a weight (a 4096-token batch). Without a shape it
# picks a layout for an unknown row count, which the kernel chosen for a real batch may not read: AMX CPUs then
# reordered every weight on every call (``ONEDNN_VERBOSE``: one reorder per Linear per batch, 12% of GEMM time).
# With it, no weight is reordered at run time for any row count, on AVX2, AVX-512 and AVX-512 VNNI (checked).
PREPACK_ROWS = 4096


class Packed(NamedTuple):
    """One Linear's prepacked int8 weight and its per-output-channel vectors (float32 [N])."""

    weight: torch.Tensor  # opaque oneDNN layout of the [N, K] codes
    w_scale: torch.Tensor
    w_zero: torch.Tensor  # int64 zeros [N]: symmetric weights
    colsum: torch.Tensor  # sum_k W[n, k] (float32, exact below 2^24)
    in_features: int
    memo: dict  # run-time choices of the split engine (cpu_int8_split): speed only, never the result


def available() -> bool:
    """True when oneDNN's int8 linear gives exact integer products here, natively or split (checked once)."""
    return mode() is not None


def mode() -> Optional[str]:
    """``"native"`` (one exact oneDNN GEMM), ``"split"`` (native saturates: two exact GEMMs) or None."""
    return _probe()[0]


def reason() -> str:
    """One line saying what the exactness probe found on this CPU (for warnings and the bench)."""
    return _probe()[1]


@functools.lru_cache(maxsize=None)
def _probe() -> Tuple[Optional[str], str]:
    """Try the native call on extreme and random codes, then the split one (once per process)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return None, "PyTorch built without oneDNN"
        cases = _probe_cases()
        if all(_exact(a, w, split=False) for a, w in cases):
            return "native", f"oneDNN int8 GEMM exact on this CPU ({torch.backends.cpu.get_cpu_capability()})"
        if all(_exact(a, w, split=True) for a, w in cases):
            return "split", ("oneDNN's u8 x s8 int8 GEMM saturates at int16 on this CPU (no VNNI: 255 x 127 pairs); "
                             "each GEMM runs on saturation-free operands (the same integers)")
        return None, "oneDNN's int8 GEMM is not exact on this CPU, even split"
    except (RuntimeError, AttributeError, NotImplementedError) as err:  # op missing or no CPU kernel
        log.info("oneDNN int8 linear unavailable (%s): backend='int8' cannot use it on CPU", err)
        return None, f"no oneDNN int8 linear in this PyTorch build ({type(err).__name__})"


def _probe_cases():
    gen = torch.Generator().manual_seed(0)
    top = (torch.full((3, 64), 127, dtype=torch.int8), torch.full((8, 64), 127, dtype=torch.int8))
    low = (torch.full((3, 64), -128, dtype=torch.int8), torch.full((8, 64), -127, dtype=torch.int8))
    rand = (torch.randint(-128, 128, (5, 24), dtype=torch.int8, generator=gen),
            torch.randint(-127, 128, (16, 24), dtype=torch.int8, generator=gen))
    return [top, low, rand]


def _exact(a: torch.Tensor, w: torch.Tensor, split: bool) -> bool:
    packed = prepack(w, torch.ones(w.shape[0]))
    return bool(torch.equal(_gemm(a, packed, 1.0, 0, None, packed.w_scale, split).to(torch.int32),
                            (a.double() @ w.double().t()).to(torch.int32)))


def prepack(codes: torch.Tensor, w_scale: torch.Tensor) -> Packed:
    """Prepack int8 weight codes ``[N, K]`` (symmetric, zero point 0) with scales ``[N]`` (or one)."""
    n, k = codes.shape
    codes = codes.to(torch.int8).contiguous()
    weight = torch.ops.onednn.qlinear_prepack(codes, [PREPACK_ROWS, k])  # the layout a full batch's kernel reads
    scale = w_scale.reshape(-1).to(torch.float32).expand(n).contiguous()
    colsum = codes.sum(dim=1, dtype=torch.float32)  # exact: integers below 2^24 (|sum| <= 127 K); 5-10x an int32 sum
    return Packed(weight, scale, torch.zeros(n, dtype=torch.int64), colsum, k, {})


def unpack(packed: Packed) -> torch.Tensor:
    """The plain int8 codes ``[N, K]`` back from the prepacked weight (for saving and the reference)."""
    return packed.weight.to_dense().t().contiguous()


def gemm(a: torch.Tensor, packed: Packed, x_scale: float = 1.0, x_zero: int = 0, bias: Optional[torch.Tensor] = None,
         w_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x_scale * w_scale[n] * (a @ W^T - x_zero * colsum[n]) + bias[n]``, float32 ``[M, N]``; int32 inside."""
    ws = packed.w_scale if w_scale is None else w_scale
    return _gemm(a, packed, x_scale, x_zero, bias, ws, mode() == "split")


def _gemm(a, packed: Packed, x_scale: float, x_zero: int, bias, ws, split: bool) -> torch.Tensor:
    acc = exact_accumulators(a, packed, int(x_zero)) if split else None
    if acc is None:  # one exact call (native, or no code above SAFE_CODE and no zero point)
        if not split:
            a, x_zero = as_u8(a, x_zero)
        return torch.ops.onednn.qlinear_pointwise(a, float(x_scale), int(x_zero), packed.weight, ws, packed.w_zero,
                                                  bias, 1.0, 0, torch.float32, "none", [], "")
    scale = (float(x_scale) * ws.double()).to(torch.float32)[None, :]  # rounded once
    # in place (out=acc: the same single pass): a fresh [M, N] output costs page faults (about 4x the pass)
    return acc.mul_(scale) if bias is None else torch.addcmul(bias.to(torch.float32)[None, :], acc, scale, out=acc)


def gemm_add_(out: torch.Tensor, a: torch.Tensor, packed: Packed, x_scale: float) -> torch.Tensor:
    """``out += x_scale * w_scale[n] * (a @ W^T)`` in oneDNN's epilogue (its "sum" post-op: no temporary, no
    extra pass); ``x_scale`` may be negative. ``out`` float32 ``[M, N]``, contiguous."""
    split = mode() == "split"
    acc = exact_accumulators(a, packed) if split else None
    if acc is None:
        a, x_zero = (a, 0) if split else as_u8(a, 0)
        return sum_post_op(out, a, packed, x_scale, packed.w_scale, x_zero)
    return out.addcmul_(acc, (float(x_scale) * packed.w_scale.double()).to(torch.float32)[None, :])


def as_u8(a: torch.Tensor, x_zero: int) -> Tuple[torch.Tensor, int]:
    """int8 codes as the u8 operand and zero point PyTorch prepacks its weights for: ``a + 128`` (the sign bit
    flipped, one byte pass) and ``x_zero + 128``, the same product. oneDNN runs int8 (s8) activations against
    these weights in its reference kernel on some AVX-512 VNNI CPUs (measured on an AMD EPYC Zen 4: 11 s for one
    408 x 480 x 1440 GEMM, against 10 ms with u8), and ``u8`` is what its fast kernels are built for everywhere."""
    return torch.bitwise_xor(a.view(torch.uint8), 128), int(x_zero) + 128


def accumulators(a: torch.Tensor, packed: Packed) -> torch.Tensor:
    """The int32 accumulators ``a @ W^T`` as oneDNN computes them (unit scales; exact below 2^24)."""
    n = packed.w_scale.shape[0]
    return gemm(a, packed, w_scale=torch.ones(n)).to(torch.int32)


def static_linear(codes: torch.Tensor, packed: Packed, scale: float, zero: int, bias: Optional[torch.Tensor]):
    """A static per-tensor site: one fused oneDNN call."""
    return gemm(codes, packed, scale, zero, bias)


def per_token_linear(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, packed: Packed,
                     bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Dynamic per-token site: ``scale[m] * (w_scale[n] * acc - zero[m] * w_scale[n] * colsum[n]) + bias``."""
    return per_token_epilogue_(gemm(codes, packed), scale, zero, packed, bias)


def per_token_epilogue_(y: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, packed: Packed,
                        bias: Optional[torch.Tensor]) -> torch.Tensor:
    """A per-token site's output from ``y = w_scale[n] * acc`` (float32 ``[M, N]``, consumed): each row's scale and
    zero point ``[M, 1]`` applied, and the bias."""
    scale = scale.detach().reshape(-1, 1).to(torch.float32)  # integer products carry no gradient
    if bool((zero != 0).any()):
        y.addcmul_(zero.reshape(-1, 1).to(torch.float32), (packed.w_scale * packed.colsum)[None, :], value=-1)
    if bias is None:
        return y.mul_(scale)
    bias = bias.detach().to(torch.float32)[None, :]
    return torch.addcmul(bias, y, scale, out=y)
