"""Exact int8 GEMMs from ONNX Runtime's MLAS on CPUs whose oneDNN u8 x s8 GEMM saturates (AVX2 without VNNI).

ONNX Runtime's ``MatMulIntegerToFloat`` (a contrib op of its CPU provider)
multiplies u8 activation codes by u8 weight codes through MLAS, which widens
u8 x u8 operands to int16 before the multiply-add (``vpmaddwd``: int32 pair
sums), so every product is exact where oneDNN's u8 x s8 pairs saturate at int16.
It subtracts both zero points in int32 and applies ``a_scale * b_scale[n] * acc
+ bias[n]`` in float32: the epilogue of oneDNN's native call.

Our codes keep their meaning: a signed code ``c`` is the u8 code ``c + 128``
(one bit flip) with its zero point moved by 128, the symmetric weight codes are
u8 with zero point 128. The accumulators are therefore the reference's exactly
(int32 holds ``K * 255 * 255`` for ``K <= MAX_K``).

One ONNX Runtime session serves every GEMM of the process (per thread count):
the weight is an input, not a constant, so the only weight copy is the module's
u8 codes (ONNX Runtime packs them per call: about 5% of a GEMM at these shapes,
measured), bound without copying through I/O binding. No GEMM is written here.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np
import torch

__all__ = ["MAX_K", "U8_SHIFT", "available", "reason", "to_u8", "from_u8", "matmul"]

U8_SHIFT = 128  # signed code + 128 = u8 code (flip the top bit)
MAX_K = (2 ** 31 - 1) // (255 * 255)  # the longest reduction whose u8 x u8 int32 sum cannot overflow: 33025

_INPUTS = ("A", "B", "a_scale", "b_scale", "a_zero", "b_zero", "bias")


def available() -> bool:
    """True when onnxruntime is installed and its u8 x u8 GEMM is exact here (checked once per process)."""
    return _probe()[0]


def reason() -> str:
    return _probe()[1]


@functools.lru_cache(maxsize=None)
def _probe():
    try:
        import onnx  # noqa: F401  (optional, both: the 'onnx' extra; onnx writes the one-node graph)
        import onnxruntime  # noqa: F401
    except ImportError as err:
        return False, f"{err.name} is not installed (pip install 'ptq-protein[onnx]')"
    gen = torch.Generator().manual_seed(0)
    cases = [(torch.full((3, 64), 127, dtype=torch.int8), torch.full((8, 64), 127, dtype=torch.int8), 0),
             (torch.full((3, 64), -128, dtype=torch.int8), torch.full((8, 64), -127, dtype=torch.int8), 5),
             (torch.randint(-128, 128, (5, 24), dtype=torch.int8, generator=gen),
              torch.randint(-127, 128, (16, 24), dtype=torch.int8, generator=gen), -3)]
    try:
        for a, w, zero in cases:
            acc = matmul(to_u8(a), to_u8(w.t()), 1.0, zero, torch.ones(w.shape[0]), None)
            if not torch.equal(acc.double(), (a.double() - zero) @ w.double().t()):
                return False, "ONNX Runtime's u8 x u8 GEMM is not exact on this CPU"
    except Exception as err:  # noqa: BLE001  (an optional engine that fails to start is not used)
        return False, f"ONNX Runtime's u8 x u8 GEMM does not run here ({type(err).__name__}: {err})"
    return True, "ONNX Runtime's u8 x u8 GEMM (MLAS) is exact on this CPU"


def to_u8(codes: torch.Tensor) -> torch.Tensor:
    """Signed int8 codes as u8 codes ``c + 128`` (contiguous; one pass)."""
    return codes.contiguous().view(torch.uint8).bitwise_xor(U8_SHIFT)


def from_u8(codes: torch.Tensor) -> torch.Tensor:
    """u8 codes back to the signed int8 codes (``c - 128``)."""
    return codes.bitwise_xor(U8_SHIFT).view(torch.int8)


@functools.lru_cache(maxsize=None)
def _session(threads: int):
    """The process's one ``MatMulIntegerToFloat`` session for ``threads`` intra-op threads (any M, K, N)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("MatMulIntegerToFloat", list(_INPUTS), ["Y"], domain="com.microsoft")
    shapes = {"A": ["M", "K"], "B": ["K", "N"], "a_scale": [], "b_scale": ["N"], "a_zero": [], "b_zero": [],
              "bias": ["N"]}
    kinds = {"A": TensorProto.UINT8, "B": TensorProto.UINT8, "a_zero": TensorProto.UINT8, "b_zero": TensorProto.UINT8}
    inputs = [helper.make_tensor_value_info(n, kinds.get(n, TensorProto.FLOAT), shapes[n]) for n in _INPUTS]
    graph = helper.make_graph([node], "int8_gemm", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", "N"])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    # idle workers sleep instead of spinning: between GEMMs PyTorch's own threads run the float operations
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


_DTYPES = {torch.uint8: np.uint8, torch.float32: np.float32}


def matmul(a_u8: torch.Tensor, w_u8: torch.Tensor, a_scale: float, a_zero: int, b_scale: torch.Tensor,
           bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``a_scale * b_scale[n] * ((a_u8 - 128 - a_zero) @ (w_u8 - 128)) + bias[n]``, float32 ``[M, N]``.

    ``a_u8`` u8 ``[M, K]`` (signed codes through :func:`to_u8`), ``w_u8`` u8 ``[K, N]``, ``a_zero`` the signed
    codes' zero point (-128..127), ``b_scale`` float32 ``[N]``.
    """
    m, k = a_u8.shape
    n = w_u8.shape[1]
    if k > MAX_K:
        raise ValueError(f"reduction of {k} exceeds {MAX_K}: the u8 x u8 int32 sum could overflow")
    args = {"A": a_u8.contiguous(), "B": w_u8.contiguous(),
            "a_scale": torch.tensor(float(a_scale), dtype=torch.float32),
            "b_scale": b_scale.to(torch.float32).contiguous(),
            "a_zero": torch.tensor(int(a_zero) + U8_SHIFT, dtype=torch.uint8),
            "b_zero": torch.tensor(U8_SHIFT, dtype=torch.uint8),
            "bias": torch.zeros(n) if bias is None else bias.to(torch.float32).contiguous()}
    out = torch.empty(m, n, dtype=torch.float32)
    if m == 0 or k == 0:
        return out.copy_(args["bias"].expand(m, n))
    session = _session(torch.get_num_threads())
    binding = session.io_binding()
    for name, value in args.items():  # the tensors stay referenced by ``args`` until run returns
        binding.bind_input(name, "cpu", 0, _DTYPES[value.dtype], list(value.shape), value.data_ptr())
    binding.bind_output("Y", "cpu", 0, np.float32, [m, n], out.data_ptr())
    session.run_with_iobinding(binding)
    return out
