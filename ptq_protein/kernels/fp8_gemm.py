"""FP8 GEMM through ``torch._scaled_mm`` (cuBLASLt on Hopper/Ada, oneDNN on CPU), beside the int8 kernels.

The recipes' FP8 (``w8a8-fp8``) is simulated exactly in float (``ptq_protein.quant.fp8``); this runs the
same codes as a real FP8 GEMM: ``y = (x_codes * x_scale) @ (w_codes * w_scale)^T + bias`` with float32
accumulation. Scales are per row of each operand (per token / per output channel; a per-tensor scale is
broadcast), the layout ``_scaled_mm``'s row-wise mode takes. CUDA needs compute capability >= 8.9 and
K, N multiples of 16 (cuBLASLt's rule); the CPU path takes any shape.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["fp8_linear", "fp8_gemm_supported"]


def fp8_gemm_supported(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` can run FP8 on ``device`` (CPU, or CUDA with capability >= 8.9)."""
    device = torch.device(device)
    if not hasattr(torch, "_scaled_mm"):
        return False
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return device.type == "cpu"


def fp8_linear(x_codes: torch.Tensor, x_scale: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor,
               bias: Optional[torch.Tensor] = None, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[M, K] x [N, K] -> [M, N]`` from FP8 codes (``torch.float8_e4m3fn`` / ``e5m2``) and float32 scales.

    ``x_scale``: a scalar or ``[M, 1]``; ``w_scale``: a scalar, ``[N]`` or ``[N, 1]``.
    """
    if x_codes.dim() != 2 or w_codes.dim() != 2 or x_codes.shape[1] != w_codes.shape[1]:
        raise ValueError(f"fp8_linear takes [M, K] and [N, K] codes, got {tuple(x_codes.shape)} and "
                         f"{tuple(w_codes.shape)}")
    if not fp8_gemm_supported(x_codes.device):
        raise RuntimeError(f"torch._scaled_mm cannot run FP8 on {x_codes.device} (CUDA needs capability >= 8.9): "
                           "use backend='fake', the exact simulation")
    m, n = x_codes.shape[0], w_codes.shape[0]
    scale_a = torch.as_tensor(x_scale, dtype=torch.float32, device=x_codes.device).reshape(-1, 1).expand(m, 1)
    scale_b = torch.as_tensor(w_scale, dtype=torch.float32, device=x_codes.device).reshape(1, -1).expand(1, n)
    out = torch._scaled_mm(x_codes, w_codes.t(), scale_a=scale_a.contiguous(), scale_b=scale_b.contiguous(),
                           out_dtype=torch.float32)
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(out_dtype)
