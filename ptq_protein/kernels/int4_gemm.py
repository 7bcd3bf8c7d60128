"""W4A8 GEMM: int8 activations x packed int4 weights, unpacked inside the kernel.

The W8A8 kernel of :mod:`ptq_protein.kernels.int8_gemm` with ``INT4_WEIGHTS``:
same arithmetic, autotune table and epilogue; only the weight tile is read as
bytes ``[BLOCK_N, BLOCK_K/2]`` (half the memory traffic of int8) and unpacked
in registers by :func:`~ptq_protein.kernels.gemm_common.load_int4_tile` (layout of
:func:`~ptq_protein.kernels.packing.pack_int4`).
"""

from __future__ import annotations

from typing import Optional

import torch

from ptq_protein.kernels.checks import check_int_matrix, check_same_device
from ptq_protein.kernels.dispatch import Backend, resolve_backend
from ptq_protein.kernels.gemm_common import check_inner, linear_epilogue
from ptq_protein.kernels.int8_gemm import launch_gemm
from ptq_protein.kernels.packing import packed_width, unpack_int4

__all__ = ["int4_linear"]


def int4_linear(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    x_zero: Optional[torch.Tensor],
    w_packed: torch.Tensor,
    w_scale: torch.Tensor,
    K: int,
    bias: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.float32,
    *,
    w_colsum: Optional[torch.Tensor] = None,
    backend: Backend | str = Backend.AUTO,
) -> torch.Tensor:
    """W4A8 linear: like :func:`~ptq_protein.kernels.int8_gemm.int8_linear` with packed int4 weights.

    Parameters
    ----------
    x_q : int8 [M, K]; x_scale : float32 scalar or [M]; x_zero : int32 scalar or [M], or None
    w_packed : uint8 [N, ceil(K/2)]
        From :func:`~ptq_protein.kernels.packing.pack_int4`; any strides.
    w_scale : float32 [N]
    K : int
        Unpacked reduction length (must equal ``x_q.shape[1]``).
    bias : float [N], optional
    out_dtype : torch.float16, torch.bfloat16 or torch.float32
    w_colsum : int32 [N], optional (keyword)
        Row sums of the unpacked weights; computed (an unpack) when a zero point needs it.
    backend : "auto", "triton" or "torch"

    Returns
    -------
    torch.Tensor, [M, N] of ``out_dtype``
    """
    x_q = check_int_matrix("x_q", x_q)
    w_packed = check_int_matrix("w_packed", w_packed, dtype=torch.uint8)
    check_inner(x_q.shape[1], K, "x_q", "the K argument")
    if w_packed.shape[1] != packed_width(K):
        raise ValueError(f"w_packed has {w_packed.shape[1]} bytes per row but K={K} needs {packed_width(K)}")
    device = check_same_device(
        x_q=x_q, x_scale=x_scale, x_zero=x_zero, w_packed=w_packed, w_scale=w_scale, bias=bias, w_colsum=w_colsum
    )
    epi = linear_epilogue(
        x_q.shape[0], w_packed.shape[0], x_scale, x_zero, w_scale, bias, w_colsum, out_dtype,
        colsum_of_weights=lambda: unpack_int4(w_packed, K).sum(dim=1, dtype=torch.int32),
    )
    if resolve_backend(backend, device) is Backend.TORCH:
        return epi.reference(x_q, unpack_int4(w_packed, K))
    out = epi.empty_output(x_q.shape[0], w_packed.shape[0], device)
    return launch_gemm(x_q, w_packed.view(torch.int8), out, epi, k=K, int4_weights=True)
