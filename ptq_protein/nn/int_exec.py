"""Integer execution of a :class:`~ptq_protein.nn.modules.QuantLinear` (``backend="int8"``).

The activation codes come from the same quantizer the fake backend uses, so
both backends share one set of parameters; the GEMM then runs on integers:
Triton kernels for CUDA tensors (or under ``TRITON_INTERPRET=1``), the exact
torch integer reference otherwise (``ptq_protein.kernels``). Rows the quantizer
keeps in floating point (BOS/EOS, :mod:`ptq_protein.nn.special_tokens`) are then
recomputed in float by ``QuantLinear._float_rows``, as in the fake backend.
"""

from __future__ import annotations

import torch

__all__ = ["int_linear", "first_accumulators"]


def _weight_operands(module):
    """Cached per-module kernel operands: codes (packed for 4-bit), [N] scales, column sums."""
    cache = module._int_cache
    if not cache:
        codes = module.weight_codes
        cache["w_q"] = codes.to(torch.int8).contiguous()
        cache["w_scale"] = module.weight_scale.reshape(-1).to(torch.float32).contiguous()
        cache["w_colsum"] = cache["w_q"].sum(dim=1, dtype=torch.int32)
        if module.weight_spec.bits <= 4:
            from ptq_protein.kernels.packing import pack_int4

            cache["w_packed"] = pack_int4(cache["w_q"])
    return cache


def int_linear(module, x: torch.Tensor) -> torch.Tensor:
    """y = x W^T + b with integer codes on both sides; x [..., K] -> [..., N] in x's dtype."""
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
