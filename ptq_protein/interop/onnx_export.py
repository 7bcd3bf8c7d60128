"""``pp.export_onnx``: an artifact as an ONNX QDQ graph that ONNX Runtime (or any QDQ runtime) can run.

What is exported: ESM-2 (fair-esm ``ESM2``, transformers ``EsmForMaskedLM`` /
``EsmModel``), ESM C (ptq-protein's ``ESMC``) and the ESM-2 stem of ESMFold, whose quantized sites are uniform
8-bit: weights per output channel, activations static per tensor or dynamic
symmetric per token. Anything else is refused in one line naming the first site
that cannot be written and why (PWLQ, FP8, 4-bit codes, per-channel activations,
quantized matmul operands).

The graph takes ``input_ids`` and ``attention_mask``, both int64 ``[batch,
length]``, as Optimum's ESM exports do: ESM-2 ids with BOS/EOS (the id table is
written beside the file, :mod:`ptq_protein.interop.onnx_vocab`; ESM C's are the same for residues and
special tokens), and 1 for a token,
0 for padding (a masked position's id is read as padding, id 1). It returns
``last_hidden_state`` ``[batch, length, channels]`` (after the final LayerNorm,
fair-esm's last ``representations``), ``logits`` first for masked LMs, and, with
``hidden_states=True`` (always for ESMFold's stem, what its trunk reads),
``hidden_states`` ``[batch, length, layers + 1, channels]``. Padded positions'
outputs are not zeroed. It is traced with torch's TorchScript exporter
(``dynamo=False``, opset 17) on a padded batch, so fair-esm's padding branch is the
one kept (it is also right without padding); the wrapper, the padded batch and the site swap are
:mod:`ptq_protein.interop.exportable`'s, shared with the OpenVINO engine.

Run it with :func:`ort_session`: ONNX Runtime otherwise rewrites a weight-only
site (``DequantizeLinear`` -> ``MatMul``) as ``MatMulNBits`` at accuracy level 4,
which quantizes that site's activations to int8 on the fly (0.5% relative error
on the tiny ESM-2); the session option ``session.qdq_matmulnbits_accuracy_level
= 0`` keeps it exact. Codes are uint8 on both sides, which ONNX Runtime's x86
kernels compute exactly (see :mod:`ptq_protein.interop.onnx_qdq`).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Union

import torch
from torch import nn

from ptq_protein.interop.exportable import PAD_ID, example_ids, exportable, swap_sites, tracing
from ptq_protein.interop.onnx_qdq import OnnxActQuant, OnnxLinear
from ptq_protein.interop.onnx_vocab import check_vocab_out, vocab_for, write_vocab
from ptq_protein.models.tokens import esmc_vocab
from ptq_protein.nn.modules import QuantLinear
from ptq_protein.recipes.config import Granularity, Scheme
from ptq_protein.support.errors import InputError

__all__ = ["export_onnx", "ort_session", "example_ids", "OPSET", "INSTALL_ONNX"]

OPSET = 17
INSTALL_ONNX = "ONNX export needs the onnx extra: pip install 'ptq-protein[onnx]' (onnx and onnxruntime)"


def export_onnx(artifact: Union[str, Path], out: Union[str, Path], *, force: bool = False,
                hidden_states: bool = False) -> Path:
    """Write the artifact's model as ONNX QDQ to the file `out`, and its id table beside it (`vocab.txt`,
    `tokens.json`); refuse what QDQ cannot express, in one line. `hidden_states`: add every layer's output."""
    try:
        import onnx  # noqa: F401  (the exporter writes through it)
    except ImportError as err:
        raise InputError(INSTALL_ONNX) from err
    from ptq_protein.artifact.save_load import load
    from ptq_protein.support.io_utils import atomic_write_bytes, check_out_path

    out = Path(out)
    check_out_path(out, force=force, what="ONNX file")  # before loading: refused in words, not after the export
    if out.is_dir():
        raise InputError(f"--out {out} is a folder; name the .onnx file to write, e.g. {out / 'model.onnx'}")
    model = load(artifact)
    wrapper = exportable(model, hidden_states)
    own = esmc_vocab() if wrapper.kind == "esmc" else ()
    tokens = vocab_for(Path(artifact), stem=wrapper.kind == "stem", default=own)
    check_vocab_out(out.parent, tokens, wrapper.outputs, force)
    check_exportable(wrapper.exported, model.ptq_recipe["sites"], wrapper.prefix)
    swap_sites(wrapper.exported, wrapper.rows, OnnxLinear, OnnxActQuant)
    ids = example_ids()
    with tracing(wrapper), torch.no_grad():
        buffer = _export_bytes(wrapper, ids, wrapper.outputs)
    atomic_write_bytes(out, buffer)
    write_vocab(out.parent, tokens, wrapper.outputs)
    return out


def ort_session(path: Union[str, Path], threads: Optional[int] = None):
    """An ONNX Runtime CPU session for an exported file, with the options that keep it exact (see above)."""
    try:
        import onnxruntime as ort
    except ImportError as err:
        raise InputError(INSTALL_ONNX) from err
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    if threads is not None:
        options.intra_op_num_threads = options.inter_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def check_exportable(model: nn.Module, sites: dict, prefix: str) -> None:
    """One line for the first site QDQ cannot express (sites outside the exported part are ignored)."""
    for name, entry in sites.items():
        if not name.startswith(prefix):
            continue
        if entry["kind"] == "matmul":
            raise InputError(f"site {name}: quantized matmul operands have no ONNX QDQ form here; export a recipe "
                             "without matmul sites")
        module = model.get_submodule(name[len(prefix):])
        reason = _unexpressible(module)
        if reason:
            raise InputError(f"site {name}: {reason}; ONNX export covers uniform 8-bit recipes "
                             "(w8a8-uniform, w8a8-dynamic, w8-only)")


def _unexpressible(module: nn.Module) -> Optional[str]:
    if isinstance(module, QuantLinear):
        spec = module.weight_spec
        if spec is not None and (spec.scheme is not Scheme.UNIFORM or spec.bits != 8 or module.weight_codebook):
            return f"weights are {spec.describe()}, not 8-bit uniform"
    quant = getattr(module, "input_quant", None)
    if quant is None:
        return None
    spec = quant.spec
    if spec.scheme is Scheme.PWLQ:
        return "PWLQ activations are not exported (an integer-friendly PWLQ form is not available yet)"
    if spec.scheme is not Scheme.UNIFORM or spec.bits != 8:
        return f"activations are {spec.describe()}, not 8-bit uniform"
    if spec.dynamic and (spec.granularity is not Granularity.PER_TOKEN or not spec.symmetric):
        return f"dynamic activations are {spec.describe()}; only symmetric per-token ones are exported"
    if not spec.dynamic and quant.scale.numel() != 1:
        return "static activations are per channel; only per-tensor ones are exported"
    return None


def _export_bytes(wrapper: nn.Module, ids: torch.Tensor, outputs: List[str]) -> bytes:
    import io
    import warnings

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python bools: the padded branch is the kept one
        axes = {name: {0: "batch", 1: "length"} for name in ["input_ids", "attention_mask", *outputs]}
        torch.onnx.export(wrapper, (ids, (ids != PAD_ID).long()), buffer, input_names=["input_ids", "attention_mask"],
                          output_names=outputs, dynamic_axes=axes, opset_version=OPSET, dynamo=False,
                          do_constant_folding=False)
    return buffer.getvalue()
