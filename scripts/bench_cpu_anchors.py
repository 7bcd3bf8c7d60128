"""The existing CPU engines ``bench_cpu_int8.py`` sets our int8 models against (each optional, skipped with a note).

* FP32 ``torch.compile`` (inductor, freezing on);
* ``torch.ao.quantization.quantize_dynamic`` (int8 Linear, fbgemm: reduce_range on x86);
* ONNX Runtime dynamic U8S8 with ``reduce_range`` (the ``[onnx]`` extra: onnx, onnxruntime), exported by
  the legacy TorchScript exporter (``dynamo=False``, opset 17) outside inference mode.

Every builder returns a callable ``tokens -> {"logits": tensor}`` or raises :class:`Skip` with a one-line note.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Callable, Dict

import torch

Forward = Callable[[torch.Tensor], Dict[str, torch.Tensor]]


class Skip(Exception):
    """An anchor that cannot run here; the message is the table's note."""


class _Logits(torch.nn.Module):
    """fair-esm's forward reduced to the logits tensor (what ONNX export and the compiler trace)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)["logits"]


def fp32_compiled(model: torch.nn.Module, tokens: torch.Tensor) -> Forward:
    try:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        compiled = torch.compile(_Logits(model).eval())
        with torch.no_grad():
            compiled(tokens)  # compile now, not in the timed rounds
    except Exception as err:  # noqa: BLE001  (any compiler failure is a skipped row, named)
        raise Skip(f"torch.compile failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}") from err
    return lambda t: {"logits": compiled(t)}


def quantize_dynamic(model: torch.nn.Module, tokens: torch.Tensor) -> Forward:
    try:
        from torch.ao.quantization import quantize_dynamic as qd

        q = qd(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
        with torch.no_grad():
            q(tokens)
    except (ImportError, AttributeError, RuntimeError) as err:
        raise Skip(f"torch.ao.quantization.quantize_dynamic unavailable: {type(err).__name__}") from err
    return q


def ort_dynamic_u8s8(model: torch.nn.Module, tokens: torch.Tensor, threads: int) -> Forward:
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType
        from onnxruntime.quantization import quantize_dynamic as ort_qd
    except ImportError as err:
        raise Skip("onnxruntime not installed (pip install 'ptq-protein[onnx]')") from err
    folder = Path(tempfile.mkdtemp(prefix="bench_ort_"))
    fp, q8 = folder / "fp32.onnx", folder / "u8s8.onnx"
    try:
        with torch.no_grad():  # not inference_mode: the legacy exporter needs version counters
            torch.onnx.export(_Logits(model).eval(), (tokens,), str(fp), dynamo=False, opset_version=17,
                              input_names=["tokens"], output_names=["logits"])
        ort_qd(str(fp), str(q8), weight_type=QuantType.QInt8, reduce_range=True)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(q8), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001  (export or quantization failure: a skipped row, named)
        raise Skip(f"ONNX export / quantization failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}") \
            from err
    return lambda t: {"logits": torch.from_numpy(session.run(None, {"tokens": t.numpy()})[0])}
