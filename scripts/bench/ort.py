"""ONNX Runtime pieces the CPU benches share: the FP32 export of a fair-esm model, ORT's ``quantize_dynamic``, and a
session's ``tokens -> logits``.

``onnx.py`` and ``cpu_anchors.py`` both set ORT's own dynamic int8 quantizer beside our models; this
is the one place that exports, quantizes and builds those sessions (the exact-kernel session options are the
library's :func:`ptq_protein.interop.onnx_export.ort_session`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable

import torch

from ptq_protein.interop.onnx_export import OPSET, ort_session

WEIGHT_TYPES = ("s8", "u8")  # ORT's QuantType.QInt8 / QuantType.QUInt8


class Logits(torch.nn.Module):
    """fair-esm's forward reduced to the logits tensor (what ONNX export and the compiler trace)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)["logits"]


def export_fp32(module: torch.nn.Module, example: torch.Tensor, path: Path, input_name: str = "tokens",
                output_name: str = "logits", dynamic: bool = True) -> Path:
    """``module`` exported to ``path`` by the legacy TorchScript exporter (opset :data:`OPSET`), traced on ``example``.

    With ``dynamic`` the first two axes (batch, length) of input and output are free. Trace on a padded batch:
    fair-esm drops its key-padding mask when a batch has no padding, so an unpadded trace never masks.
    """
    axes = {input_name: {0: "batch", 1: "length"}, output_name: {0: "batch", 1: "length"}} if dynamic else None
    with torch.no_grad(), warnings.catch_warnings():  # not inference_mode: the legacy exporter needs version counters
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (example,), str(path), input_names=[input_name], output_names=[output_name],
                          opset_version=OPSET, dynamo=False, dynamic_axes=axes)
    return Path(path)


def quantize_dynamic(fp: Path, out: Path, weights: str = "s8", per_channel: bool = False,
                     reduce_range: bool = False) -> Path:
    """ORT's ``quantize_dynamic`` of the FP32 graph ``fp`` into ``out``: u8 activations, ``weights`` "s8" or "u8",
    per-tensor weights unless ``per_channel`` (ORT's default); ``reduce_range``: 7-bit weights (x86 CPUs without
    VNNI saturate u8 x s8 pair sums at int16 otherwise)."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    if weights not in WEIGHT_TYPES:
        raise ValueError(f"weights={weights!r}: expected one of {WEIGHT_TYPES}")
    weight_type = QuantType.QInt8 if weights == "s8" else QuantType.QUInt8
    ort_quantize_dynamic(str(fp), str(out), weight_type=weight_type, per_channel=per_channel,
                         reduce_range=reduce_range)
    return Path(out)


PAD = 1  # the ESM alphabet's <pad> id


def logits_fn(path: Path, threads: int, input_name: str = "tokens") -> Callable[[torch.Tensor], torch.Tensor]:
    """``tokens -> logits`` through an ONNX Runtime CPU session of the graph at ``path``.

    A graph that also takes ``attention_mask`` (``pp.export_onnx``'s) gets ``tokens != <pad>``; the output read
    is the one named ``logits`` (an export lists ``last_hidden_state`` first), else the graph's only one.
    """
    session = ort_session(path, threads)
    wanted = {i.name for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    output = ["logits"] if "logits" in outputs else outputs[:1]

    def run(tokens: torch.Tensor) -> torch.Tensor:
        feed = {input_name: tokens.numpy()}
        if "attention_mask" in wanted:
            feed["attention_mask"] = (tokens != PAD).long().numpy()
        return torch.from_numpy(session.run(output, feed)[0])

    return run
