"""Triton int8 kernels and their exact torch integer references (imported lazily).

Public functions (plain tensors in, tensor out), each with ``backend="auto" |
"triton" | "torch"``:

* :func:`int8_linear`, :func:`int8_matmul_int32` - W8A8 GEMM (``int8_gemm``)
* :func:`int4_linear`, :func:`pack_int4`, :func:`unpack_int4` - W4A8 (``int4_gemm``, ``packing``)
* :func:`quantize_per_token`, :func:`quantize_per_tensor` - activations to int8 (``quantize``)
* :func:`pwlq_quantize`, :func:`pwlq_linear` - piecewise-affine codes (``pwlq_encode``, ``pwlq_gemm``)
* :class:`Int8Linear` - W8A8 ``nn.Linear`` stand-in (``linear_module``)
* :func:`fp8_linear` - FP8 GEMM through ``torch._scaled_mm`` (``fp8_gemm``; no Triton)

Importing this package imports neither Triton nor a kernel module; the first
attribute access imports the one module it needs. Set ``TRITON_INTERPRET=1``
before that to run the kernels on CPU tensors in Triton's interpreter.
"""

from __future__ import annotations

import importlib

__all__ = [
    "Int8Linear",
    "fp8_gemm_supported",
    "fp8_linear",
    "int4_linear",
    "int8_linear",
    "int8_matmul_int32",
    "pack_int4",
    "pwlq_linear",
    "pwlq_quantize",
    "quantize_per_tensor",
    "quantize_per_token",
    "unpack_int4",
]

_HOME = {
    "Int8Linear": "linear_module",
    "fp8_gemm_supported": "fp8_gemm",
    "fp8_linear": "fp8_gemm",
    "int4_linear": "int4_gemm",
    "int8_linear": "int8_gemm",
    "int8_matmul_int32": "int8_gemm",
    "pack_int4": "packing",
    "pwlq_linear": "pwlq_gemm",
    "pwlq_quantize": "pwlq_encode",
    "quantize_per_tensor": "quantize",
    "quantize_per_token": "quantize",
    "unpack_int4": "packing",
}


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
