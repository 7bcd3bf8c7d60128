"""Integer execution of a :class:`~ptq_protein.nn.modules.QuantLinear` (``backend="int8"``).

The activation codes come from the same quantization rules the fake backend
uses, so both backends share one set of parameters; the GEMM then runs on
integers, on one of these engines (:class:`Engine`):

* ``onednn``: the CPU fast path (:mod:`ptq_protein.nn.cpu_int8`; PWLQ sites in
  :mod:`ptq_protein.nn.cpu_pwlq`), oneDNN's int8 GEMM on weights prepacked once;
  activation codes in one compiled pass.
* ``reference``: the exact torch integer reference (``ptq_protein.kernels``);
  on CUDA tensors (or under ``TRITON_INTERPRET=1``) its wrappers run the Triton kernels.
* ``auto`` (default): ``onednn`` for CPU tensors where it runs and the site is
  one it handles; on other CPU sites the ``float`` path (the fake backend's
  product: the torch integer reference is 2 to 15 times slower than fake, and
  ``backend="int8"`` is never slower than ``"fake"``), announced by one warning
  line naming the engine and why; ``reference`` elsewhere (CUDA: Triton).

:func:`engine_used` tells which engine a model's last forward ran.

Rows the quantizer keeps in floating point (BOS/EOS, :mod:`ptq_protein.nn.special_tokens`)
are then recomputed in float by ``QuantLinear._float_rows`` from the int8 codes (:func:`float_rows_linear`).
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from ptq_protein.recipes.config import Engine

__all__ = ["Engine", "EngineFallbackWarning", "int_linear", "codes_rows_linear", "float_rows_linear",
           "first_accumulators", "set_engine", "engine_used", "weight_codes"]


def parse_engine(engine) -> Engine:
    try:
        return Engine(engine)
    except ValueError as err:
        raise ValueError(f"unknown engine {engine!r}; choose one of: {', '.join(e.value for e in Engine)}") from err


def set_engine(model: nn.Module, engine) -> nn.Module:
    """Choose the integer engine of every QuantLinear in `model` (in place; returns `model`)."""
    choice = parse_engine(engine)
    if choice is Engine.ONEDNN and not _onednn_available():
        from ptq_protein.nn.cpu_int8 import reason

        raise ValueError(f"engine 'onednn' is not available here ({reason()}); use engine='auto' or 'reference'")
    for m in model.modules():
        if hasattr(m, "engine_ran"):  # a QuantLinear (not imported: modules imports this file)
            m.engine = choice
    return model


def engine_used(model: nn.Module) -> Optional[str]:
    """The engine(s) the last forward ran on integer sites ("onednn", "reference", "float", joined by "+"), or None."""
    used = sorted({m.engine_ran for m in model.modules() if getattr(m, "engine_ran", None)})
    return "+".join(used) or None


def _onednn_available() -> bool:
    from ptq_protein.nn.cpu_int8 import available

    return available()


def weight_codes(module) -> torch.Tensor:
    """Plain int8 weight codes ``[N, K]`` of a QuantLinear (unpacked from the prepacked copy if released)."""
    return module.plain_weight_codes()


class EngineFallbackWarning(UserWarning):
    """``backend="int8"`` runs a CPU site on the float path instead of an exact integer engine."""


# Measured on the 12 x 480 bench model (AMD EPYC, AVX2, 1 thread): w8a8-pwlq 2.6x FP32 on split oneDNN, fake 1.2x.
_SPLIT_PWLQ = ("PWLQ's exact int8 GEMMs (two or more per site, each split against this CPU's int16 saturation) "
               "are slower than backend='fake' here")


def _onednn_mode() -> Optional[str]:
    from ptq_protein.nn.cpu_int8 import mode

    return mode()


def _fast_blocker(module, x: torch.Tensor) -> Optional[str]:
    """Why the oneDNN path cannot run this CPU site (None when it can: symmetric weights, scalar static scale,
    per-token or static PWLQ input)."""
    from ptq_protein.nn.cpu_int8 import reason

    if not _onednn_available():
        return reason()
    if module.weight_codebook is not None or not module.symmetric_weight_codes():
        return "the oneDNN engine takes symmetric uniform weight codes only"
    quant = module.input_quant
    if quant.spec.scheme.value == "pwlq":
        if not quant.is_static:
            return "the oneDNN engine takes static PWLQ inputs only"
        return _SPLIT_PWLQ if module.engine is Engine.AUTO and _onednn_mode() == "split" else None
    if quant.is_static:
        return None if quant.scale.numel() == 1 else "the oneDNN engine takes one static activation scale only"
    return None if quant.spec.granularity.value == "per_token" else "the oneDNN engine takes per-token dynamic inputs"


def int_linear(module, x: torch.Tensor) -> torch.Tensor:
    """y = x W^T + b with integer codes on both sides; x [..., K] -> [..., N] in x's dtype."""
    if module.engine is Engine.REFERENCE:
        module.engine_ran = Engine.REFERENCE.value
        return _reference_linear(module, x)
    cpu = x.device.type == "cpu"
    blocker = _fast_blocker(module, x) if cpu else "oneDNN runs CPU tensors only"
    if blocker is None and _float_is_faster(module):
        module.engine_ran = "float"
        return _fake_product(module, x)
    if blocker is None:
        from ptq_protein.nn.int_fast import fast_linear

        module.engine_ran = Engine.ONEDNN.value
        return fast_linear(module, x)
    if module.engine is Engine.ONEDNN:
        raise ValueError(f"engine 'onednn' cannot run this site ({module.input_quant.spec.describe()} on "
                         f"{x.device}): {blocker}; use engine='auto' or 'reference'")
    if cpu:
        _warn_float(blocker)
        module.engine_ran = "float"
        return _fake_product(module, x)
    module.engine_ran = Engine.REFERENCE.value
    return _reference_linear(module, x)


# A PWLQ site's exact int8 form is two or more GEMMs plus an encoding pass; below this many input and output
# features each it ran 1.5-4x slower than the float product on one AVX-512 VNNI core (480 x 480: 1.50x, 256: 1.95x,
# 128 x 128 on ESMFold-like pair rows: 3.4x; 1024 x 1024: 0.89x), so ``auto`` runs the float product there, silently
# (a choice of speed: the values are the simulation's, as ``backend="fake"`` computes them).
PWLQ_INT8_FROM = 1024


def _float_is_faster(module) -> bool:
    """``auto`` only: a PWLQ-input site too small for its region GEMMs to beat one float GEMM."""
    return (module.engine is Engine.AUTO and module.input_quant.spec.scheme.value == "pwlq"
            and min(module.in_features, module.out_features) < PWLQ_INT8_FROM)


def _fake_product(module, x: torch.Tensor) -> torch.Tensor:
    """The fake backend's product (``QuantLinear.forward``): quantize-dequantize the input, float GEMM."""
    bias = None if module.bias is None else module.bias.to(x.dtype)
    return F.linear(module.input_quant(x), module.dequantized_weight(x.dtype), bias)


@functools.lru_cache(maxsize=None)
def _warn_float(why: str) -> None:
    """One line per cause and process."""
    warnings.warn(f"backend='int8' runs the float path (the fake backend's product, not integer GEMMs) on CPU: "
                  f"{why}, and the exact integer reference is slower than backend='fake'; "
                  f"set_engine(model, 'onednn' or 'reference') forces an integer engine", EngineFallbackWarning,
                  stacklevel=5)


def float_rows_linear(module, rows: torch.Tensor) -> torch.Tensor:
    """The rows kept in floating point (BOS/EOS): ``(rows @ codes^T) * w_scale + bias``, float32 ``[R, N]``.

    Read from the int8 codes, not from a dequantized float weight (four passes over
    ``[N, K]`` per call): where the fast path holds a prepacked copy, the rows run
    through it as int8 planes (:func:`~ptq_protein.nn.cpu_int8_fused.float_rows`,
    as the fused layer runs them), else through the plain codes. Equal to the fake
    backend's ``F.linear(rows, (codes - 0) * w_scale)`` up to float32 rounding. Weight
    codebooks and asymmetric weights take the dequantized weight.
    """
    if not module.symmetric_weight_codes():
        return F.linear(rows, module.dequantized_weight(rows.dtype), module.bias)
    packed = module._int_cache.get("packed")
    if packed is not None:  # int8 planes through the packed weight: no float copy of [K, N] per call
        from ptq_protein.nn.cpu_int8_fused import float_rows

        return float_rows(rows, packed, module.bias)
    return codes_rows_linear(rows, weight_codes(module).t().contiguous(), module.weight_scale, module.bias)


def codes_rows_linear(rows: torch.Tensor, codes: torch.Tensor, w_scale: torch.Tensor,
                      bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``(rows @ codes) * w_scale + bias``: float ``rows [R, K]``, int8 ``codes [K, N]``, float32 ``[R, N]``."""
    y = torch.mm(rows.to(torch.float32), codes.to(torch.float32)).mul_(w_scale.reshape(1, -1))
    return y if bias is None else y.add_(bias.to(torch.float32))


def _weight_operands(module):
    """Cached per-module reference operands: codes (packed for 4-bit), [N] scales, column sums."""
    cache = module._int_cache
    if "w_q" not in cache:
        cache["w_q"] = weight_codes(module).to(torch.int8).contiguous()
        cache["w_scale"] = module.weight_scale.reshape(-1).to(torch.float32).contiguous()
        cache["w_colsum"] = cache["w_q"].sum(dim=1, dtype=torch.int32)
        if module.weight_spec.bits <= 4:
            from ptq_protein.kernels.packing import pack_int4

            cache["w_packed"] = pack_int4(cache["w_q"])
    return cache


def _reference_linear(module, x: torch.Tensor) -> torch.Tensor:
    from ptq_protein.kernels.int8_gemm import int8_linear

    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    codes, params = module.input_quant.encode(x2)
    codes = codes.to(torch.int8)
    ops = _weight_operands(module)
    bias = module.bias
    out_dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float32
    if params[0] == "pwlq":
        from ptq_protein.kernels.pwlq_gemm import pwlq_linear

        cb = params[1]
        dev = x.device
        y = pwlq_linear(codes, cb.offsets(dev), cb.scales(dev), cb.code_lo_tensor(dev), cb.code_hi_tensor(dev),
                        ops["w_q"], ops["w_scale"], bias, out_dtype=out_dtype)
    else:
        scale = params[1].reshape(-1).to(torch.float32)
        zero = params[2].reshape(-1).to(torch.int32)
        if scale.numel() == 1:
            scale, zero = scale.reshape(()), zero.reshape(())
        if "w_packed" in ops:
            from ptq_protein.kernels.int4_gemm import int4_linear

            y = int4_linear(codes, scale, zero, ops["w_packed"], ops["w_scale"], shape[-1], bias=bias,
                            out_dtype=out_dtype)
        else:
            y = int8_linear(codes, scale, zero, ops["w_q"], ops["w_scale"], bias, w_colsum=ops["w_colsum"],
                            out_dtype=out_dtype)
    return y.reshape(*shape[:-1], y.shape[-1]).to(x.dtype)


def first_accumulators(module, x: torch.Tensor) -> torch.Tensor:
    """Raw int32 accumulators codes(x) @ W^T of a uniform-input site (for exactness checks)."""
    from ptq_protein.kernels.int8_gemm import int8_matmul_int32

    codes, _ = module.input_quant.encode(x.reshape(-1, x.shape[-1]))
    return int8_matmul_int32(codes.to(torch.int8), _weight_operands(module)["w_q"])
