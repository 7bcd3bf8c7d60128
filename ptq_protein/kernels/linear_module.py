"""``Int8Linear``: a W8A8 stand-in for ``nn.Linear`` built on the kernels.

Weights: symmetric per-output-channel int8 (the per-row rule of
:func:`~ptq_protein.kernels.quantize.quantize_per_token` applied to
``weight [N, K]``). Activations: dynamic per-token int8, quantized on every
call. The output has the input's dtype. This is the benchmark's W8A8 module;
the project's calibrated modules live in ``ptq_protein.quant``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ptq_protein.kernels.checks import FLOAT_DTYPES
from ptq_protein.kernels.dispatch import Backend
from ptq_protein.kernels.int8_gemm import int8_linear
from ptq_protein.kernels.quantize import quantize_per_token

__all__ = ["Int8Linear"]

_BITS = 8


class Int8Linear(nn.Module):
    """W8A8 linear: int8 weights in buffers, per-token int8 activations at run time.

    Parameters
    ----------
    in_features, out_features : int
    bias : bool
    act_symmetric : bool
        Symmetric per-token activation codes (no zero point) or asymmetric.
    backend : "auto", "triton" or "torch"
        Passed to the kernels (see :mod:`ptq_protein.kernels.dispatch`).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        act_symmetric: bool = True,
        backend: Backend | str = Backend.AUTO,
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.act_symmetric = act_symmetric
        self.backend = Backend(backend)
        self.register_buffer("w_q", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("w_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer("w_colsum", torch.zeros(out_features, dtype=torch.int32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    @classmethod
    @torch.no_grad()
    def from_float(
        cls, linear: nn.Linear, *, act_symmetric: bool = True, backend: Backend | str = Backend.AUTO
    ) -> "Int8Linear":
        """Quantize ``linear``'s weight per output channel; ``linear`` itself is left unchanged."""
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"Int8Linear.from_float needs an nn.Linear, got {type(linear).__name__}")
        weight = linear.weight.detach()
        module = cls(
            linear.in_features, linear.out_features, linear.bias is not None,
            act_symmetric=act_symmetric, backend=backend, device=weight.device,
        )
        w_q, w_scale, _ = quantize_per_token(weight, _BITS, symmetric=True, backend=backend)
        module.w_q.copy_(w_q)
        module.w_scale.copy_(w_scale)
        module.w_colsum.copy_(w_q.sum(dim=1, dtype=torch.int32))
        if linear.bias is not None:
            module.bias = linear.bias.detach().clone()
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in_features]`` to ``[..., out_features]`` in ``x.dtype``."""
        if x.dtype not in FLOAT_DTYPES:
            raise ValueError(f"Int8Linear expects float16, bfloat16 or float32 input, got {x.dtype}")
        lead = x.shape[:-1]
        x_q, x_scale, x_zero = quantize_per_token(
            x.reshape(-1, self.in_features), _BITS, symmetric=self.act_symmetric, backend=self.backend
        )
        y = int8_linear(
            x_q, x_scale, None if self.act_symmetric else x_zero, self.w_q, self.w_scale,
            self.bias, self.w_colsum, out_dtype=x.dtype, backend=self.backend,
        )
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"act_symmetric={self.act_symmetric}, backend={self.backend.value}"
        )
