"""The float work between an integer encoder layer's GEMMs, each step in as few passes as eager PyTorch allows.

An int8 layer (:mod:`ptq_protein.nn.layer_int8`) hands oneDNN unsigned activation codes (``code + 128``, what its
fast kernels take) and gets float32 or bfloat16 back. Between the GEMMs, three steps touch every activation:

* :func:`layer_norm` then :func:`codes`: the LayerNorm's input quantizer (if the recipe has one), the LayerNorm,
  and the next GEMM's activation codes (each row's own range for a per-token site), quantized in place in the
  LayerNorm's output;
* :func:`rotary`: q scaled and rotary on q and k as one complex multiply each (``(x1 + i x2)(cos + i sin)`` is
  ESM's rotate-half rotary), written contiguous ``[B, T, H, D]`` with each head's dimensions interleaved
  (``x1_0, x2_0, x1_1, ...``): q and k share that order, so attention scores are unchanged;
* :func:`codes` (attention's output): quantized in place, rows in the residual's order.

Nothing here is compiled: ``torch.compile`` made these steps about 3x faster per pass, but importing and
tracing it costs about 3.5 s of CPU per process, more than it saves on workloads under about a hundred
4096-token batches (measured; docs/benchmarks-history.md).

Codes are computed with the quantizer's own float32 operations (``quant.uniform.quantize``), so from equal
inputs they are equal; the LayerNorm and the rotary products round like eager PyTorch's.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch.nn import functional as F

__all__ = ["Quant", "U8_OFFSET", "codes", "layer_norm", "rotary", "rotary_table"]

U8_OFFSET = 128  # unsigned code = signed code + 128 (the same product, oneDNN's fast operand)
Quant = Tuple[torch.Tensor, torch.Tensor, int, int]  # a static uniform quantizer: scale, zero point, qmin, qmax


def codes(y: torch.Tensor, quant: Quant) -> torch.Tensor:
    """uint8 ``quantize(y) + 128`` of float32 ``y``, computed in ``y``'s memory (``y`` is consumed).

    The same float32 operations as ``quant.uniform.quantize``: ``clamp(round(y / scale) + zero, qmin, qmax)``.
    ``scale`` and ``zero`` may be one per row (``[M, 1]``: a dynamic per-token quantizer's).
    """
    scale, zero, qmin, qmax = quant
    if zero.dim() == 0:
        low, high = float(qmin - zero), float(qmax - zero)
    else:  # one zero point per row
        low, high = (qmin - zero).to(y.dtype), (qmax - zero).to(y.dtype)
    y = y.div_(scale).round_().clamp_(low, high)  # round(y / scale) + zero in [qmin, qmax], less the zero point
    # the zero point and the unsigned offset in 8 bits (the sum is in [0, 255]: wrapping is exact), after a
    # float -> int8 conversion: float -> uint8 is 2-6x slower on CPU than both
    return y.to(torch.int8).view(torch.uint8).add_((zero + U8_OFFSET).to(torch.uint8))


def fake_quantize(x: torch.Tensor, quant: Quant) -> torch.Tensor:
    """``(clamp(round(x / s) + z) - z) * s`` in a new float32 tensor (``nn.fused.uniform_fake``'s operations)."""
    scale, zero, qmin, qmax = quant
    zp = float(zero)
    return torch.div(x, scale).round_().add_(zp).clamp_(qmin, qmax).sub_(zp).mul_(scale)


def layer_norm(x: torch.Tensor, fake: Optional[Quant], weight: torch.Tensor, bias: Optional[torch.Tensor],
               eps: float) -> torch.Tensor:
    """``LayerNorm(fake_quantize(x))`` in a new float32 tensor (``fake`` None: no input quantizer)."""
    return F.layer_norm(x if fake is None else fake_quantize(x, fake), (x.shape[-1],), weight, bias, eps)


def rotary_table(cos: torch.Tensor, sin: torch.Tensor, scaling: float = 1.0) -> torch.Tensor:
    """complex64 ``scaling * (cos + i sin)`` of the first half of ESM's rotary tables ``[..., T, 1, D]`` (their two
    halves are equal: ``emb = cat(freqs, freqs)``)."""
    half = cos.shape[-1] // 2
    return torch.complex(cos[..., :half].float() * scaling, sin[..., :half].float() * scaling)


def rotary(x: torch.Tensor, table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rotate-half rotary of ``x [B, T, H, D]`` (any strides) by ``table`` (:func:`rotary_table`), contiguous
    ``[B, T, H, D]`` in ``dtype`` with each head's pairs interleaved: ``(x1_j c_j - x2_j s_j, x2_j c_j + x1_j s_j)``
    at dimensions ``2j, 2j + 1``."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].float(), x[..., half:].float()).mul_(table)
    out = torch.view_as_real(z).flatten(-2)
    return out if dtype == torch.float32 else out.to(dtype)
