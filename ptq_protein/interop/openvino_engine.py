"""``--engine openvino``: an ESM-2 artifact's forward run by OpenVINO, its integer GEMMs from the artifact's codes.

OpenVINO fuses what PyTorch runs op by op: attention as one kernel with the rotary embedding, GELU and the
activation quantizers into the GEMMs around them, and runs the float parts in bfloat16 where the CPU has it.
Built from the artifact's transformers form (:func:`ptq_protein.artifact.fair_hf.load_as_transformers`) with
each quantized site in the form OpenVINO's int8 passes recognise (:mod:`ptq_protein.interop.openvino_sites`):
the weight codes, scales and zero points, and the activation quantizers, are the artifact's.

What differs from ``pp.load``'s model: the float parts (LayerNorm, attention, GELU) run in OpenVINO's
inference precision, bfloat16 on CPUs with avx512_bf16 or AMX unless ``--dtype float32`` asks for float32, and
a value on a rounding tie of the next quantizer can take the neighbouring code, as between the fake and int8
backends. The engine is offered only on CPUs whose int8 GEMM is exact (VNNI or AMX: OpenVINO's u8 x s8 GEMM on
AVX2 alone saturates 16-bit pair sums) and for static or per-token 8-bit uniform recipes (what ONNX export
takes too). It returns representations and logits; contact maps need attention weights it does not keep.

Converting takes longer than a forward (tracing the model), so the converted model is kept in a cache
folder (``PTQ_PROTEIN_CACHE``, else ``$XDG_CACHE_HOME/ptq-protein``, else ``~/.cache/ptq-protein``), named
by the artifact's sealed tensor digest and the versions that built it; each run checks the artifact's seal
before using it, so an edited artifact never runs a stale model. Runs that convert the same artifact at once
each trace it; the first to finish puts its folder in place and the others use that one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional, Sequence

import torch
from torch import nn

from ptq_protein.interop.exportable import PAD_ID
from ptq_protein.models.lm_outputs import LMInfo, LMOutputs, normalize_layers
from ptq_protein.support.errors import InputError

__all__ = ["INSTALL_OPENVINO", "OpenVinoLM", "why_not", "check_request", "load_openvino", "cache_root"]

log = logging.getLogger(__name__)

INSTALL_OPENVINO = "--engine openvino needs the openvino extra: pip install 'ptq-protein[openvino]'"
_EXACT_INT8 = ("amx_int8", "avx512_vnni", "avx_vnni")  # int32 accumulation without saturating pair sums
_PRECISION = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
_FORMAT = 1  # bump when the converted graph changes for the same artifact
_FILES = ("model.xml", "model.bin", "info.json")  # a conversion's folder: the graph, its weights, its outputs


def why_not(device: str) -> Optional[str]:
    """Why the engine cannot run here (None when it can)."""
    from ptq_protein.nn.backend_choice import cpu_flags

    if importlib.util.find_spec("openvino") is None:
        return INSTALL_OPENVINO
    if device != "cpu":
        return f"--engine openvino runs on the CPU; drop --device {device}, or use --engine torch"
    if not set(_EXACT_INT8) & cpu_flags():
        return ("--engine openvino: this CPU has no VNNI or AMX, where OpenVINO's int8 GEMM saturates 16-bit pair "
                "sums (inexact); use --engine torch, whose integer GEMMs are exact here")
    return None


def check_request(include: Sequence[str]) -> None:
    """Refuse outputs the engine does not make, before anything loads."""
    if "contacts" in include:
        raise InputError("--engine openvino does not keep attention maps, so it has no contacts; leave 'contacts' "
                         "out of --include, or use --engine torch")


def cache_root() -> Path:
    """Where converted models are kept (see the module docstring)."""
    given = os.environ.get("PTQ_PROTEIN_CACHE")
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ptq-protein"


class OpenVinoLM(nn.Module):
    """A compiled OpenVINO model that :func:`ptq_protein.models.lm_outputs.lm_forward` runs like an ESM-2 model."""

    def __init__(self, compiled, info: LMInfo, outputs: List[str], words: str):
        super().__init__()
        self.compiled, self.lm_info, self.outputs, self.engine_words = compiled, info, outputs, words

    def engine_outputs(self, tokens: torch.Tensor, repr_layers: Sequence[int], *, contacts: bool = False,
                       logits: bool = True) -> LMOutputs:
        """One forward over ESM ``tokens`` [B, T] (padding id 1): the asked layers and logits, float32 on the CPU."""
        if contacts:
            raise ValueError("the OpenVINO engine has no contact maps; use --engine torch")
        ids = tokens.to(torch.int64).numpy()
        found = self.compiled({"input_ids": ids, "attention_mask": (ids != PAD_ID).astype(ids.dtype)})
        got = {name: torch.from_numpy(found[self.compiled.output(name)]).float() for name in self.outputs}
        last = self.lm_info.last_layer
        reps = {layer: got["last_hidden_state"] if layer == last else got["hidden_states"][:, :, layer]
                for layer in repr_layers}
        return LMOutputs(reps, got.get("logits") if logits else None, None)


def load_openvino(artifact: Path, *, layers: Sequence[int], logits: bool, dtype: Optional[str],
                  threads: int) -> OpenVinoLM:
    """The artifact compiled by OpenVINO for these outputs (converted once, then read from the cache)."""
    import openvino as ov

    from ptq_protein.artifact.save_load import verified_recipe

    recipe = verified_recipe(artifact)  # the seal, before a cached model stands in for these tensors
    _check_recipe(recipe, artifact)
    last = _last_layer(recipe)
    wanted = normalize_layers(layers, last) if last >= 0 else [None]
    variant = {"logits": logits, "hidden_states": any(layer != last for layer in wanted)}
    key = json.dumps({"tensors": recipe["files"]["model.safetensors"]["sha256"], "format": _FORMAT,
                      "openvino": ov.__version__, "torch": torch.__version__.split("+")[0], **variant},
                     sort_keys=True)
    folder = cache_root() / "openvino" / hashlib.sha256(key.encode()).hexdigest()[:32]
    info = _cached(folder)
    if info is None:
        _convert(artifact, folder, **variant)
        info = _cached(folder)
    # no on-the-fly int8 of float inputs to int8-weight products (the BOS/EOS rows' float path, weight-only sites):
    # OpenVINO's CPU default would quantize them per group of 32 values, which the artifact does not
    config = {"INFERENCE_NUM_THREADS": threads, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
    if dtype:
        config["INFERENCE_PRECISION_HINT"] = _PRECISION[dtype]
    core = ov.Core()
    compiled = core.compile_model(core.read_model(folder / "model.xml"), "CPU", config)
    precision = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    words = (f"OpenVINO {ov.__version__.split('-')[0]} (int8 GEMMs from the artifact's codes; float parts in "
             f"{precision}{'' if dtype else ', its default on this CPU'}; converted model cached in {folder})")
    return OpenVinoLM(compiled, LMInfo(**info["lm_info"]), info["outputs"], words)


def _last_layer(recipe: dict) -> int:
    """ESM-2's last ``repr_layers`` index (its layer count) from the recipe's architecture record."""
    arch = recipe.get("architecture", {})
    for where in (arch.get("kwargs", {}), arch.get("config", {})):
        for key in ("num_layers", "num_hidden_layers"):
            if isinstance(where, dict) and where.get(key) is not None:
                return int(where[key])
    return -1  # unknown: every layer is exported


def _check_recipe(recipe: dict, artifact: Path) -> None:
    """ESM-2 artifacts only (ESM C and ESMFold's stem run with --engine torch)."""
    arch = recipe.get("architecture", {})
    name = arch.get("class") or arch.get("model_class") or ""
    if name not in ("ESM2", "EsmForMaskedLM", "EsmModel"):
        raise InputError(f"--engine openvino runs ESM-2 artifacts; {artifact} holds a {name or 'model of another kind'}"
                         "; use --engine torch")


def _cached(folder: Path) -> Optional[dict]:
    """The ``info.json`` of the conversion in ``folder``; None where there is no folder yet.

    A folder that is there but not a whole conversion (a file missing, an unreadable ``info.json``) is refused in
    one line: :func:`~ptq_protein.support.io_utils.atomic_dir` puts a conversion's folder in place only once it
    is written, so a folder this engine made, in this run or another, is always whole.
    """
    if not (folder.exists() or folder.is_symlink()):
        return None
    try:
        info = json.loads((folder / "info.json").read_text())
    except (OSError, ValueError):
        info = None
    whole = isinstance(info, dict) and {"lm_info", "outputs"} <= info.keys()
    if not (whole and all((folder / name).is_file() for name in _FILES)):
        raise FileExistsError(f"{folder} is not a whole converted OpenVINO model ({', '.join(_FILES)}): it was left "
                              "by something else or changed since; remove it and run again")
    return info


def _convert(artifact: Path, folder: Path, *, logits: bool, hidden_states: bool) -> None:
    """Trace the artifact's transformers form with OpenVINO's sites and save it (atomically) in ``folder``; where
    another run put its conversion there meanwhile, keep that one (if whole: :func:`_cached`)."""
    import openvino as ov

    from ptq_protein.artifact.fair_hf import load_as_transformers
    from ptq_protein.interop.exportable import example_ids, exportable, swap_sites, tracing
    from ptq_protein.interop.onnx_export import check_exportable
    from ptq_protein.interop.openvino_sites import OvActQuant, OvLinear
    from ptq_protein.models.lm_outputs import lm_info
    from ptq_protein.support.io_utils import atomic_dir

    started = time.perf_counter()
    log.info("converting %s for OpenVINO (once; kept in %s)", artifact, folder)
    model = load_as_transformers(artifact, backend="fake")  # the codes as stored; OpenVINO runs them
    info = lm_info(model)
    torso = model if logits or not hasattr(model, "esm") else model.esm
    check_exportable(torso, model.ptq_recipe["sites"], "esm." if torso is not model else "")
    wrapper = exportable(torso, hidden_states)
    swap_sites(wrapper.exported, wrapper.rows, OvLinear, OvActQuant)
    ids = example_ids()
    with tracing(wrapper), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python values: the padded branch is the kept one
        converted = ov.convert_model(_Outputs(wrapper), example_input=(ids, (ids != PAD_ID).long()))
    for port, name in zip(converted.inputs, ("input_ids", "attention_mask")):
        port.get_node().set_partial_shape(ov.PartialShape([-1, -1]))
        port.get_tensor().set_names({name})
    for port, name in zip(converted.outputs, wrapper.outputs):
        port.get_tensor().set_names({name})
    converted.validate_nodes_and_infer_types()
    try:
        with atomic_dir(folder, what="OpenVINO cache folder") as tmp:
            ov.save_model(converted, tmp / "model.xml", compress_to_fp16=False)
            (tmp / "info.json").write_text(json.dumps({"lm_info": asdict(info), "outputs": wrapper.outputs}))
    except FileExistsError:  # the folder appeared while this run converted: another run's, kept if whole
        if _cached(folder) is None:
            raise
        log.info("another run put its conversion in %s first; using that one", folder)
        return
    log.info("converted in %.0f s", time.perf_counter() - started)


class _Outputs(nn.Module):
    """The export wrapper with its outputs as a tuple in :attr:`outputs` order (what the tracer keeps)."""

    def __init__(self, wrapper: nn.Module):
        super().__init__()
        self.wrapper = wrapper

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        return tuple(self.wrapper(input_ids, attention_mask))
