"""Fused fake quantization: a quantizer's float arithmetic as one compiled elementwise loop.

Eager PyTorch runs a static piecewise-linear (PWLQ) fake quantizer as about
fifteen passes over the tensor (region search, parameter gather, divide, round,
clamp, decode), which made a PWLQ forward three times slower than the float
model. ``torch.compile`` fuses the same operations into one loop (C++ on CPU,
Triton on CUDA). The functions here are written so that the fused loop is
vectorised: the region parameters come from a chain of ``where`` on scalars
rather than a gather.

The compiled loop performs the same float32 (or float64) operations in the same
order as the eager reference (true division, round half to even, separate
multiply and add: inductor compiles with ``-ffp-contract=off``), so its values
equal ``decode(encode(x))`` exactly; ``tests/core/test_fused.py`` checks it on
every region boundary, NaN and +-Inf. (Inductor may return +0.0 where eager
returns -0.0; they compare equal.)

Two guards keep a wrong kernel from giving silently wrong values: the vector
width inductor picks is named in the compile options (so a cache written on an
AVX-512 CPU is not read where AVX2 is picked), and in each process the first
compiled call of each function on a CPU tensor is compared with the eager
function on the start of that input; any difference falls back to eager for good.

Policy, from ``PTQ_PROTEIN_FUSED`` or :func:`configure`:

* ``auto`` (default): compile CPU tensors of at least ``min_numel`` values
  (small tensors are cheaper eagerly than through the compiled call's guards), once a function's eager calls
  have cost :data:`AUTO_AFTER_SECONDS` in the process, about what compiling it costs (a short run never repays
  compiling; a long one pays at most twice the better choice);
* ``on``: compile every tensor, CUDA ones too; ``off``: always eager.

CUDA stays eager under ``auto``: Triton may contract ``offset + scale * q`` into
one fused multiply-add (a last-bit difference in the decoded value) and, unless
inductor is told otherwise (done here where torch has the switch), divides
approximately (a code off by one at a rounding tie), so bit-equality with eager
there is checked only by the GPU-marked test, not promised.

The first call per (function, dtype) compiles for a few seconds. When
compilation is impossible here (no C++ compiler, an unsupported Python) the
failure is logged once and everything runs eagerly from then on.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

from ptq_protein.support.env_settings import FUSED, FUSED_MODES, fused_mode

__all__ = ["FusedSettings", "configure", "settings", "fused_call", "padded_regions", "piecewise_codes",
           "piecewise_fake",
           "piecewise_zero_code", "region_mask", "region_operand",
           "uniform_codes", "uniform_codes_eager", "uniform_fake"]

log = logging.getLogger(__name__)

MODES, ENV_VAR = FUSED_MODES, FUSED
DEFAULT_MIN_NUMEL = 1 << 18  # ~a 256-token x 1024-channel activation; below it eager wins


@dataclass(frozen=True)
class FusedSettings:
    """When to run fake quantizers through ``torch.compile``."""

    mode: str = "auto"
    min_numel: int = DEFAULT_MIN_NUMEL

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"fused fake-quant mode {self.mode!r} is not one of {MODES} "
                             f"(set {ENV_VAR} to one of them)")
        if self.min_numel < 0:
            raise ValueError(f"min_numel={self.min_numel} must be >= 0")


def settings_from_env() -> FusedSettings:
    """The settings ``PTQ_PROTEIN_FUSED`` asks for; a value not in ``MODES`` is a ValueError naming it."""
    return FusedSettings(mode=fused_mode())


_settings: Optional[FusedSettings] = None
_compiled: Dict[Callable, Callable] = {}
_eager_seconds: Dict[Callable, float] = {}  # auto: seconds each function has run eagerly so far in this process
# auto compiles a function once its eager calls have cost this much: importing and tracing torch.compile costs 2-3 s
# of CPU per process, which a 12-protein run of an int8 ESM C 600M (1.6 s of eager per-token codes) never repays,
# while a fake-backend model's ~100 quantizers reach it within a few forwards (rent until the rent paid equals the
# price: never more than twice the cost of the better choice in hindsight).
AUTO_AFTER_SECONDS = 2.0
_broken: Optional[str] = None  # why compilation failed here, once it has
_checked: set = set()  # functions whose compiled loop matched eager on a real input in this process


def settings() -> FusedSettings:
    """The current policy (read from ``PTQ_PROTEIN_FUSED`` on first use)."""
    global _settings
    if _settings is None:
        _settings = settings_from_env()
    return _settings


def configure(mode: Optional[str] = None, min_numel: Optional[int] = None) -> FusedSettings:
    """Set the policy for this process; returns the previous one (to restore it)."""
    global _settings
    old = settings()
    _settings = FusedSettings(mode=old.mode if mode is None else mode,
                              min_numel=old.min_numel if min_numel is None else min_numel)
    return old


def _wanted(x: torch.Tensor) -> bool:
    s = settings()
    if s.mode == "off" or _broken is not None or x.numel() == 0:
        return False
    if s.mode == "auto" and (x.numel() < s.min_numel or x.device.type != "cpu"):
        return False
    # Autograd keeps the eager path (the compiled call runs detached), and a
    # torch-function mode (the MATMUL interceptor) would be traced into the graph.
    return not x.requires_grad and not torch._C._is_torch_function_mode_enabled()


def _compile_options() -> dict:
    """Inductor options: IEEE division in Triton code where this torch has the switch, and
    compilation in this process.

    These loops are a few lines each; inductor's default pool of compile worker
    processes costs more memory than it saves time (on ESM-2 150M the pool's
    largest process peaked at 1.2 GB, twice the quantizing process itself).
    """
    from torch._inductor import config

    numerics = getattr(config, "eager_numerics", None)
    options = {"eager_numerics.division_rounding": True} if hasattr(numerics, "division_rounding") else {}
    if hasattr(config, "compile_threads") and not os.environ.get("TORCHINDUCTOR_COMPILE_THREADS"):
        options["compile_threads"] = 1
    width = _vector_width()
    if width and getattr(getattr(config, "cpp", None), "simdlen", 0) is None:
        options["cpp.simdlen"] = width  # the width inductor would pick anyway, now part of its cache key
    return options


def _vector_width() -> Optional[int]:
    """Bits of the vector ISA inductor picks for CPU code here (AVX2 256, AVX-512 512), None when unknown.

    Inductor's on-disk cache did not tell kernels built for one ISA from another: a cache written with
    AVX-512 code and read where AVX2 is picked (``ATEN_CPU_CAPABILITY=avx2``, or a cache folder shared by
    nodes of different CPUs) returned wrong values with no error (fake quantization off by 1e37), and the
    reverse crashed. Naming the width in the options puts it in the cache key.
    """
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        isa = pick_vec_isa()
        return int(isa.bit_width()) if isa else None
    except Exception:  # a torch without this module, or no compiler to probe: inductor decides alone
        return None


def _compiled_version(fn: Callable) -> Callable:
    if fn not in _compiled:
        _compiled[fn] = torch.compile(fn, dynamic=True, options=_compile_options())
    return _compiled[fn]


def fused_call(fn: Callable[..., torch.Tensor], x: torch.Tensor, *params, channels: bool = False,
               eager: Optional[Callable[..., torch.Tensor]] = None) -> torch.Tensor:
    """``fn(x, *params)``, compiled when the policy says so, else ``(eager or fn)(x, *params)``.

    ``eager`` is an equal-valued implementation that is faster without
    compilation. The compiled call gets one canonical input, so one graph serves
    every site: ``x`` flattened (``[rows, C]`` when ``channels``, for parameters
    on the last dim), contiguous, detached (a view would make dynamo guard on
    its base's layout), under ``no_grad`` (grad mode is part of the guards).
    """
    if torch.compiler.is_compiling():  # inside the user's own torch.compile: let it trace fn
        return fn(x, *params)
    wanted = _wanted(x)
    if wanted and _repays(fn):
        global _broken
        flat = (x.reshape(-1, x.shape[-1] if x.dim() else 1) if channels else x.reshape(-1)).contiguous().detach()
        try:
            with torch.no_grad():
                compiled = _compiled_version(fn)
                if fn not in _checked and flat.device.type == "cpu":  # equality is promised on CPU only
                    _check_against_eager(fn, compiled, flat, params)
                return compiled(flat, *params).reshape(x.shape)
        except Exception as err:  # compilation unavailable or wrong here: remember, fall back for good
            _broken = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
            log.warning("the quantizers' compiled loops cannot run here (%s), so they run as plain PyTorch "
                        "operations: the same results, more slowly (set %s=off to skip compiling)", _broken, ENV_VAR)
    if not (wanted and settings().mode == "auto"):  # only auto's eager calls are timed (_repays)
        return (eager or fn)(x, *params)
    start = time.perf_counter()
    out = (eager or fn)(x, *params)
    _eager_seconds[fn] = _eager_seconds.get(fn, 0.0) + time.perf_counter() - start
    return out


def _repays(fn: Callable) -> bool:
    """``on`` compiles at once; ``auto`` once ``fn``'s eager calls have cost :data:`AUTO_AFTER_SECONDS`."""
    if settings().mode != "auto" or fn in _compiled:
        return True
    return _eager_seconds.get(fn, 0.0) >= AUTO_AFTER_SECONDS


class CompiledMismatch(RuntimeError):
    """The compiled loop's values differ from the eager function's on a real input (a miscompiled or stale kernel)."""


_CHECK_VALUES = (1 << 16) + 7  # several vector widths and a tail: the compiled loop's every code path


def _check_against_eager(fn: Callable, compiled: Callable, flat: torch.Tensor, params: tuple) -> None:
    """Compare the compiled loop with ``fn`` run eagerly on the start of the first real input, once per function.

    Values must be equal (NaN where NaN; +0.0 and -0.0 count as equal). A kernel from a stale or mismatched
    inductor cache gave wrong values with no error (:func:`_vector_width`); any such case falls back to eager.
    """
    rows = max(1, _CHECK_VALUES // max(1, flat.shape[-1])) if flat.dim() == 2 else _CHECK_VALUES
    probe = flat[:rows]
    # per-row parameters (a dynamic per-token scale [rows, 1]) are cut with the rows they belong to
    params = tuple(p[:rows] if torch.is_tensor(p) and p.dim() == 2 == flat.dim() and p.shape[0] == flat.shape[0]
                   else p for p in params)
    got, want = compiled(probe, *params), fn(probe, *params)
    same = got.shape == want.shape and bool(((got == want) | (got.isnan() & want.isnan())).all())
    if not same:
        raise CompiledMismatch(f"the compiled {fn.__name__} differs from its eager values on this input")
    _checked.add(fn)


def padded_regions(thresholds: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same codebook with its region count rounded up to a power of two (one graph per size class).

    Extra regions copy the last one behind ``+inf`` thresholds, so every input
    (``+inf`` and NaN included) decodes exactly as before.
    """
    r = table.shape[0]
    size = 1 << (r - 1).bit_length()
    if size == r:
        return thresholds, table
    pad_thr = torch.full((size - r,), float("inf"), dtype=thresholds.dtype, device=thresholds.device)
    return torch.cat([thresholds, pad_thr]), torch.cat([table, table[-1:].expand(size - r, -1)])


# -- the fused functions (plain torch: also correct, if slower, when run eagerly) ----------


def _region_codes(x: torch.Tensor, thresholds: torch.Tensor, table: torch.Tensor):
    """Per-element region parameters (offset, scale, as x's dtype) and float codes of a piecewise codebook.

    ``thresholds`` [R-1] ascending (x's dtype); ``table`` [R, 4] float32 rows of
    ``(offset, scale, code_lo, code_hi)``. Region ``r`` holds ``thr[r-1] <= x < thr[r]``
    (NaN lands in the last region and its code stays NaN).
    """
    last = table.shape[0] - 1
    enc = table.to(x.dtype)
    off, sc, lo, hi = enc[last, 0], enc[last, 1], enc[last, 2], enc[last, 3]
    for r in range(last - 1, -1, -1):  # the lowest region whose upper threshold exceeds x
        below = x < thresholds[r]
        off = torch.where(below, enc[r, 0], off)
        sc = torch.where(below, enc[r, 1], sc)
        lo = torch.where(below, enc[r, 2], lo)
        hi = torch.where(below, enc[r, 3], hi)
    return off, sc, torch.minimum(torch.maximum(torch.round((x - off) / sc), lo), hi)


def piecewise_fake(x: torch.Tensor, thresholds: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Fake PWLQ of float ``x``: ``decode(encode(x))`` of a piecewise codebook, float32.

    Tables as in :func:`_region_codes`; encoding runs in x's dtype, decoding in
    float32, as :func:`pwlq_quantize` / :func:`pwlq_dequantize` do. NaN stays NaN.
    """
    off, sc, q = _region_codes(x, thresholds, table)
    return off.to(torch.float32) + sc.to(torch.float32) * q.to(torch.float32)


def uniform_fake(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """Fake uniform quantization of float ``x``, float32: ``(clamp(round(x/s) + z) - z) * s``.

    ``scale`` float32 and ``zero_point`` int32, scalars or ``[C]`` on x's last dim.
    Codes are small integers, so computing them in x's float dtype is exact.
    """
    zp = zero_point.to(x.dtype)
    q = torch.clamp(torch.round(x / scale.to(x.dtype)) + zp, qmin, qmax)
    return (q - zp).to(torch.float32) * scale


def uniform_codes(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """Int8 codes of :func:`ptq_protein.quant.uniform.quantize` (one scalar scale and zero point) in one loop.

    NaN encodes like 0 (the zero point, clamped), +-Inf clamp; the same float32
    operations as the eager rule. NaN is replaced after the clamp by a vectorised
    ``q == q`` test: an ``isnan`` on the input compiles to a scalar loop that
    tripled the pass's time.
    """
    zp = zero_point.to(x.dtype)
    q = torch.clamp(torch.round(x / scale.to(x.dtype)) + zp, qmin, qmax)
    return torch.where(q == q, q, torch.clamp(zp, qmin, qmax)).to(torch.int8)


def uniform_codes_eager(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int,
                        qmax: int) -> torch.Tensor:
    """:func:`uniform_codes`' values in four eager passes (one temporary, updated in place) instead of seven: what
    runs until compiling repays. The same float32 operations in the same order."""
    zp = zero_point.to(x.dtype)
    q = torch.div(x, scale.to(x.dtype))
    q.round_().add_(zp).clamp_(qmin, qmax)
    if not bool(torch.isfinite(q.sum())):  # only NaN survives the clamp as non-finite
        q = torch.where(q == q, q, torch.clamp(zp, qmin, qmax))
    return q.to(torch.int8)


def piecewise_codes(x: torch.Tensor, thresholds: torch.Tensor, table: torch.Tensor,
                    zero_code: torch.Tensor) -> torch.Tensor:
    """Int8 codes of :func:`ptq_protein.quant.codebook.pwlq_quantize` in one loop (tables as :func:`_region_codes`).

    NaN encodes like 0: ``zero_code`` (:func:`piecewise_zero_code`, passed in
    rather than recomputed per vector of the loop) replaces it after the clamp, as
    in :func:`uniform_codes`.
    """
    q = _region_codes(x, thresholds, table)[2]
    return torch.where(q == q, q, zero_code).to(torch.int8)


def piecewise_zero_code(thresholds: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The (float, 0-d) code of 0.0, which NaN takes, in thresholds' dtype."""
    return _region_codes(torch.zeros((), dtype=thresholds.dtype, device=thresholds.device), thresholds, table)[2]


def region_operand(codes: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """Int8 ``codes - bounds[2]`` where ``bounds[0] <= codes <= bounds[1]``, else 0 (a PWLQ region's operand).

    ``bounds`` int32 [3]; the caller guarantees the shifted codes fit in int8.
    """
    q = codes.to(torch.int32)
    inside = (q >= bounds[0]) & (q <= bounds[1])
    return torch.where(inside, q - bounds[2], torch.zeros((), dtype=torch.int32, device=q.device)).to(torch.int8)


def region_mask(codes: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """Int8 indicator of ``bounds[0] <= codes <= bounds[1]`` (a PWLQ region's offset operand)."""
    q = codes.to(torch.int32)
    one, zero = torch.ones((), dtype=torch.int32, device=q.device), torch.zeros((), dtype=torch.int32, device=q.device)
    return torch.where((q >= bounds[0]) & (q <= bounds[1]), one, zero).to(torch.int8)  # bool.to(int8): a scalar loop
