"""Quantized sites in the form OpenVINO's PyTorch frontend turns into integer GEMMs.

The ONNX export (:mod:`ptq_protein.interop.onnx_qdq`) writes uint8 codes on both sides for ONNX Runtime's
exact u8 x u8 kernels. OpenVINO reads the model from PyTorch directly instead, and its low-precision passes
recognise two patterns: an activation ``aten::fake_quantize_per_tensor_affine`` (a ``FakeQuantize`` node) in
front of a ``MatMul`` whose weight is an int8 constant times a per-output-channel scale (a compressed weight).
Together they become one int8 ``FullyConnected``: oneDNN's u8 x s8 GEMM, exact on CPUs with VNNI or AMX (the
engine is offered only there: :func:`ptq_protein.interop.openvino_engine.why_not`). The codes, scales and zero
points are the artifact's, so the integers are those of ``pp.load``'s model.

BOS/EOS rows a recipe keeps in float take the float product of their own, written over their rows with
``scatter`` (OpenVINO has no rule for ``index_put``).
"""

from __future__ import annotations

import torch

from ptq_protein.interop.onnx_qdq import U8_SHIFT, OnnxActQuant, OnnxLinear, SpecialRows
from ptq_protein.nn.modules import ActQuantizer, QuantLinear
from ptq_protein.quant.uniform import qrange

__all__ = ["OvActQuant", "OvLinear"]


class OvActQuant(OnnxActQuant):
    """A static per-tensor 8-bit activation quantizer as ``fake_quantize_per_tensor_affine`` (signed codes, in the
    quantizer's own range: symmetric ones stop at -127)."""

    def __init__(self, quant: ActQuantizer, rows: SpecialRows):
        super().__init__(quant, rows)
        self.code_range = qrange(quant.spec.bits, quant.spec.symmetric)

    def qdq(self, x: torch.Tensor) -> torch.Tensor:
        if self.dynamic:
            return self._dynamic(x)
        zero = int(self.zero_point) - U8_SHIFT  # back to the artifact's signed zero point
        return torch.fake_quantize_per_tensor_affine(x, float(self.scale), zero, *self.code_range)


class OvLinear(OnnxLinear):
    """A :class:`QuantLinear` as int8 weight codes times their per-channel scale, after :class:`OvActQuant`."""

    def __init__(self, linear: QuantLinear, rows: SpecialRows):
        super().__init__(linear, rows)
        self.codes = linear.plain_weight_codes().to(torch.int8).contiguous()  # [N, K]: signed, as stored
        self.scale = linear.weight_scale.reshape(-1, 1).clone()
        self.zero_point = linear.weight_zero_point.reshape(-1, 1).to(torch.float32)
        quant: ActQuantizer = linear.input_quant
        self.input_quant = None if quant is None else OvActQuant(quant, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = ((self.codes.to(torch.float32) - self.zero_point) * self.scale).t()
        if self.input_quant is None:
            return self._add_bias(torch.matmul(x, weight))
        y = torch.matmul(self.input_quant.qdq(x), weight)
        keep = self.input_quant.keep()
        return self._add_bias(y if keep is None else _float_rows(x, keep, weight, y))


def _float_rows(x: torch.Tensor, keep: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``y`` with the rows ``keep`` marks replaced by ``x``'s rows times ``weight`` in float (``scatter``)."""
    rows = keep.expand(*x.shape[:-1], 1).reshape(-1).nonzero().reshape(-1)
    flat = y.reshape(-1, y.shape[-1])
    kept = torch.matmul(x.reshape(-1, x.shape[-1]).index_select(0, rows), weight)
    return flat.scatter(0, rows[:, None].expand(-1, flat.shape[-1]), kept).reshape(y.shape)
