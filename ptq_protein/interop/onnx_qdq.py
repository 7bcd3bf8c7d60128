"""Modules that export a quantized site as ONNX QuantizeLinear / DequantizeLinear (QDQ) nodes.

Each op is an autograd ``Function`` whose ``forward`` is the fake quantization
(used only while tracing) and whose ``symbolic`` writes the QDQ nodes. Codes are
written as **uint8 on both sides** (activations and weights; a signed code ``c``
becomes ``c + 128`` with zero point ``z + 128``), because x86 CPUs without VNNI
run ONNX Runtime's u8 x s8 kernels with 16-bit pair sums that saturate; its
u8 x u8 kernels widen first and are exact. The decoded values are the same
floats as :mod:`ptq_protein.nn.modules` computes: ``(q - z) * s``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ptq_protein.nn.modules import ActQuantizer, QuantLinear
from ptq_protein.quant.uniform import SCALE_FLOOR, qrange

__all__ = ["OnnxActQuant", "OnnxLinear", "SpecialRows", "U8_SHIFT"]

U8_SHIFT = 128  # signed int8 code + 128 = uint8 code


class _QDQ(torch.autograd.Function):
    """Static per-tensor: ``Clip`` to the code range, then uint8 ``QuantizeLinear`` / ``DequantizeLinear``."""

    @staticmethod
    def forward(ctx, x, scale, zero_point, lo, hi):
        z = zero_point.to(torch.float32)
        q = torch.clamp(torch.round(torch.clamp(x, lo, hi) / scale) + z, 0, 255)
        return (q - z) * scale

    @staticmethod
    def symbolic(g, x, scale, zero_point, lo, hi):
        q = g.op("QuantizeLinear", g.op("Clip", x, lo, hi), scale, zero_point)
        return g.op("DequantizeLinear", q, scale, zero_point)


class _RowQDQ(torch.autograd.Function):
    """Per-row (one scale per token) uint8 QDQ of a 2-D ``x`` with run-time scales: per-axis, axis 0."""

    @staticmethod
    def forward(ctx, x, scale, zero_point):
        z = zero_point.to(torch.float32)[:, None]
        q = torch.clamp(torch.round(x / scale[:, None]) + z, 0, 255)
        return (q - z) * scale[:, None]

    @staticmethod
    def symbolic(g, x, scale, zero_point):
        q = g.op("QuantizeLinear", x, scale, zero_point, axis_i=0)
        return g.op("DequantizeLinear", q, scale, zero_point, axis_i=0)


class _WeightDQ(torch.autograd.Function):
    """uint8 weight codes ``[K, N]`` decoded per output column (axis 1): the ``MatMul`` operand."""

    @staticmethod
    def forward(ctx, codes, scale, zero_point):
        return (codes.to(torch.float32) - zero_point.to(torch.float32)) * scale

    @staticmethod
    def symbolic(g, codes, scale, zero_point):
        return g.op("DequantizeLinear", codes, scale, zero_point, axis_i=1)


class SpecialRows:
    """The BOS/EOS rows of the running forward, ``[..., 1]`` in the activations' layout (set by the exporter).

    The model's own :class:`~ptq_protein.nn.special_tokens.SpecialTokenContext` finds
    the layout from the activation's sizes, which a tracer records as tensors.
    """

    mask: Optional[torch.Tensor] = None


class OnnxActQuant(nn.Module):
    """An exportable :class:`ActQuantizer` (uniform 8-bit, static per-tensor or dynamic symmetric per-token)."""

    def __init__(self, quant: ActQuantizer, rows: SpecialRows):
        super().__init__()
        spec = quant.spec
        self.dynamic = spec.dynamic
        self.rows = rows if quant.special_tokens is not None else None
        qmin, qmax = qrange(spec.bits, spec.symmetric)
        self.qmax = qmax
        if not self.dynamic:
            scale = quant.scale.reshape(())
            self.register_buffer("scale", scale.clone())
            self.register_buffer("zero_point", (quant.zero_point.reshape(()) + U8_SHIFT).to(torch.uint8))
            zp = quant.zero_point.reshape(()).to(torch.float32)
            self.register_buffer("lo", ((qmin - zp) * scale).reshape(()))  # the codes' range, as values
            self.register_buffer("hi", ((qmax - zp) * scale).reshape(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The quantized values, BOS/EOS rows mixed back in as they were (``Where``)."""
        keep = self.keep()
        return self.qdq(x) if keep is None else torch.where(keep, x, self.qdq(x))

    def keep(self) -> Optional[torch.Tensor]:
        """The running forward's BOS/EOS rows ``[..., 1]`` kept in float, or None."""
        return None if self.rows is None else self.rows.mask

    def qdq(self, x: torch.Tensor) -> torch.Tensor:
        """Every row quantized and decoded (``QuantizeLinear`` / ``DequantizeLinear``)."""
        return self._dynamic(x) if self.dynamic else _QDQ.apply(x, self.scale, self.zero_point, self.lo, self.hi)

    def _dynamic(self, x: torch.Tensor) -> torch.Tensor:
        """Symmetric per-token: ``scale = max|row| / qmax`` (floored), as :func:`per_token_qparams` computes it."""
        rows = x.reshape(-1, x.shape[-1])
        scale = torch.clamp(rows.abs().amax(dim=-1) / self.qmax, min=SCALE_FLOOR)
        zero = torch.full_like(scale, U8_SHIFT, dtype=torch.uint8)
        return _RowQDQ.apply(rows, scale, zero).reshape(x.shape)


class OnnxLinear(nn.Module):
    """An exportable :class:`QuantLinear`: input QDQ, uint8 weight codes decoded per column, ``MatMul`` + bias.

    The ``MatMul`` reads the QDQ pair directly, which ONNX Runtime fuses into one
    integer GEMM (``MatMulIntegerToFloat``, u8 x u8: exact). BOS/EOS rows kept in
    float are gathered (``NonZero``, ``Gather``), multiplied by the decoded weight
    in a float ``MatMul`` of their own and written over their rows
    (``ScatterND``): the fake backend's separate float rows. (Mixed into the
    input with ``Where`` instead, they would keep ONNX Runtime from fusing the
    site: a float ``MatMul`` over every row.)
    """

    def __init__(self, linear: QuantLinear, rows: SpecialRows):
        super().__init__()
        codes = linear.plain_weight_codes().to(torch.int16) + U8_SHIFT
        self.register_buffer("codes", codes.t().contiguous().to(torch.uint8))
        self.register_buffer("scale", linear.weight_scale.reshape(-1).clone())
        self.register_buffer("zero_point", (linear.weight_zero_point.reshape(-1) + U8_SHIFT).to(torch.uint8))
        self.bias: Optional[nn.Parameter] = linear.bias
        self.input_quant = None if linear.input_quant is None else OnnxActQuant(linear.input_quant, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = _WeightDQ.apply(self.codes, self.scale, self.zero_point)
        if self.input_quant is None:
            return self._add_bias(torch.matmul(x, weight))
        y = torch.matmul(self.input_quant.qdq(x), weight)
        keep = self.input_quant.keep()
        return self._add_bias(y if keep is None else _float_rows(x, keep, weight, y))

    def _add_bias(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.bias is None else y + self.bias


def _float_rows(x: torch.Tensor, keep: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``y`` with the rows ``keep`` marks replaced by ``x``'s rows times ``weight`` in float."""
    rows = keep.expand(*x.shape[:-1], 1).reshape(-1).nonzero().reshape(-1)
    flat = y.reshape(-1, y.shape[-1])
    kept = torch.matmul(x.reshape(-1, x.shape[-1]).index_select(0, rows), weight)
    return flat.index_put((rows,), kept).reshape(y.shape)
