"""A QuantLinear on the CPU fast path: prepack once, encode in one pass, one oneDNN call per GEMM.

The weight is prepacked on first use (or by :func:`prepack_module` at load) and
the plain int8 codes are then released, so the module holds one int8 copy; the
codes come back from the packed copy when something asks for them
(``state_dict``, the reference engine). Static and dynamic per-token activation
codes come from one compiled elementwise loop (:mod:`ptq_protein.nn.fused`) that
performs the quantizer's float32 operations, so they equal ``input_quant.encode``
bit for bit (per-token: after the row ranges, two eager reductions).
"""

from __future__ import annotations

import torch

from ptq_protein.nn import cpu_int8, cpu_pwlq
from ptq_protein.nn.fused import fused_call, piecewise_codes, piecewise_zero_code, uniform_codes, uniform_codes_eager
from ptq_protein.quant.uniform import per_token_qparams, qrange

__all__ = ["fast_linear", "fast_product", "prepack_module", "encode_codes"]


def prepack_module(module) -> cpu_int8.Packed:
    """Prepack ``module``'s weight codes (once) and release the plain copy."""
    cache = module._int_cache
    if "packed" not in cache:
        packed = cpu_int8.prepack(module.plain_weight_codes(), module.weight_scale)
        cache["packed"] = packed
        module.release_weight_codes(lambda: cpu_int8.unpack(packed))
    return cache["packed"]


def encode_codes(quant, x2: torch.Tensor) -> tuple:
    """``quant.encode(x2)`` for ``x2 [M, K]``: static codes in one fused pass, dynamic ones eagerly."""
    xf = x2 if x2.dtype == torch.float64 else x2.to(torch.float32)
    if not quant.is_static:
        if quant.spec.granularity.value != "per_token" or quant.spec.scheme.value != "uniform":
            codes, params = quant.encode(x2)
            return codes.to(torch.int8), params
        return _per_token_codes(quant, xf)
    if quant.spec.scheme.value == "pwlq":
        thresholds, table = quant._region_table(xf.device)
        thresholds = thresholds.to(xf.dtype)
        codes = fused_call(piecewise_codes, xf, thresholds, table, _zero_code(quant, thresholds, table))
        return codes, ("pwlq", quant.codebook)
    qmin, qmax = qrange(quant.spec.bits, quant.spec.symmetric)
    codes = fused_call(uniform_codes, xf, quant.scale, quant.zero_point, qmin, qmax, eager=uniform_codes_eager)
    return codes, ("uniform", quant.scale, quant.zero_point)


def _per_token_codes(quant, xf: torch.Tensor) -> tuple:
    """:func:`~ptq_protein.quant.uniform.dynamic_per_token`: the same row ranges and parameters, the codes in one
    compiled pass over ``[M, K]`` (per-row scale and zero point) instead of six eager ones."""
    scale, zero = per_token_qparams(xf, quant.spec.bits, quant.spec.symmetric)
    qmin, qmax = qrange(quant.spec.bits, quant.spec.symmetric)
    codes = fused_call(uniform_codes, xf, scale, zero, qmin, qmax, channels=True, eager=uniform_codes_eager)
    return codes, ("uniform", scale, zero)


def _zero_code(quant, thresholds: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The code NaN takes, cached per region table (rebuilt with it after a move)."""
    cached = getattr(quant, "_zero_code", None)
    if cached is None or cached[0] is not table or cached[1].dtype != thresholds.dtype:
        cached = (table, piecewise_zero_code(thresholds, table))
        quant._zero_code = cached
    return cached[1]


def _plan(cache: dict, packed: cpu_int8.Packed, cb, bias) -> cpu_pwlq.PwlqPlan:
    if cache.get("pwlq_book") is not cb:
        cache["pwlq_plan"] = cpu_pwlq.pwlq_plan(cb, packed, bias)
        cache["pwlq_book"] = cb
    return cache["pwlq_plan"]


def fast_product(quant, packed: cpu_int8.Packed, bias, cache: dict, x2: torch.Tensor) -> torch.Tensor:
    """``x2 [M, K]`` -> float32 ``[M, N]`` through ``quant``'s codes and ``packed`` (``cache``: the PWLQ plan)."""
    codes, params = encode_codes(quant, x2)
    if params[0] == "pwlq":
        return cpu_pwlq.pwlq_linear(codes, _plan(cache, packed, params[1], bias), packed)
    bias = None if bias is None else bias.to(torch.float32)
    if quant.is_static:
        return cpu_int8.static_linear(codes, packed, float(params[1]), int(params[2]), bias)
    return cpu_int8.per_token_linear(codes, params[1], params[2], packed, bias)


def fast_linear(module, x: torch.Tensor) -> torch.Tensor:
    """y = x W^T + b on the oneDNN path; x [..., K] -> [..., N] in x's dtype."""
    shape = x.shape
    packed = prepack_module(module)
    y = fast_product(module.input_quant, packed, module.bias, module._int_cache, x.reshape(-1, shape[-1]))
    return y.reshape(*shape[:-1], y.shape[-1]).to(x.dtype)
