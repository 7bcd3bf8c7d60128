"""Save and reload quantized models as a folder: safetensors + JSON, never pickles.

Layout of an artifact folder::

    model.safetensors   integer weight codes (int8; <=4-bit packed two per byte as uint8),
                        their scales / zero points, activation scales / zero points /
                        PWLQ codebook tensors, and every tensor kept in floating point
    recipe.json         config, per-site quantizer specs, architecture, model source and
                        checksum, calibration set and sha256, versions, tensor-file checksum
    report.json / .md   per-site statistics

Saving is atomic (temp folder, then rename); loading verifies the tensor file's
size and sha256 before reading it.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Any, Dict, Optional, Union

import torch
from torch import nn

from ptq_protein import __version__
from ptq_protein.api import CalibrationInfo, QuantState
from ptq_protein.models.architecture import build_architecture, describe_architecture
from ptq_protein.config import Backend, QuantConfig, SiteKind, TensorQuant
from ptq_protein.errors import ArtifactError
from ptq_protein.io_utils import atomic_dir
from ptq_protein.nn.modules import ActQuantizer, QuantInput, QuantLinear
from ptq_protein.kernels.packing import pack_int4, unpack_int4
from ptq_protein.quant.codebook import PiecewiseCodebook
from ptq_protein.report import report_markdown
from ptq_protein.calibration.matmul_sites import QuantMatmulHost
from ptq_protein.calibration.sites import Site, set_module

__all__ = ["save", "load", "ARTIFACT_FORMAT", "ARTIFACT_VERSION"]

ARTIFACT_FORMAT = "ptq-protein-artifact"
ARTIFACT_VERSION = 1
TENSORS, RECIPE, REPORT_JSON, REPORT_MD = "model.safetensors", "recipe.json", "report.json", "report.md"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _versions() -> Dict[str, str]:
    out = {"ptq_protein": __version__, "torch": torch.__version__, "python": platform.python_version()}
    for mod in ("transformers", "esm"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # optional libraries: record only what is importable
            pass
    return out


def _site_entry(qmodel: nn.Module, site: Site) -> Optional[Dict[str, Any]]:
    module = qmodel.get_submodule(site.name)
    if isinstance(module, QuantLinear):
        entry: Dict[str, Any] = {"kind": "linear", "in_features": module.in_features,
                                 "out_features": module.out_features,
                                 "weight_spec": None if module.weight_spec is None else module.weight_spec.to_dict()}
        if module.weight_codebook is not None:
            entry["weight_codebook"] = module.weight_codebook.to_dict()
        quant = module.input_quant
    elif isinstance(module, QuantInput):
        entry, quant = {"kind": "input"}, module.input_quant
    elif isinstance(module, QuantMatmulHost):
        return {"kind": "matmul", "operands": {f"{site.name}@{k.replace('_', '.')}": q.state()
                                               for k, q in module.quantizers.items()}}
    else:
        return None
    if quant is not None:
        entry["input_quant"] = quant.state()
    return entry


def _tensor_dict(qmodel: nn.Module, sites: Dict[str, Dict[str, Any]]) -> tuple:
    """State dict ready for safetensors: 4-bit codes packed, tied tensors stored once."""
    tensors: Dict[str, torch.Tensor] = {}
    aliases: Dict[str, str] = {}
    seen: Dict[tuple, str] = {}
    for key, value in qmodel.state_dict().items():
        ident = (value.data_ptr(), value.shape, value.dtype, value.stride()) if value.numel() else None
        if ident is not None and ident in seen:
            aliases[key] = seen[ident]
            continue
        if ident is not None:
            seen[ident] = key
        tensors[key] = value.detach().cpu().contiguous()
    for name, entry in sites.items():
        spec = entry.get("weight_spec")
        key = f"{name}.weight_codes"
        if spec is not None and spec["bits"] <= 4 and key in tensors:
            tensors[f"{name}.weight_packed"] = pack_int4(tensors.pop(key))
    return tensors, aliases


def save(qmodel: nn.Module, path: Union[str, Path], *, force: bool = False,
         model_info: Optional[Dict[str, Any]] = None) -> Path:
    """Write ``qmodel`` (from :func:`ptq_protein.quantize`) to the folder ``path``, atomically."""
    from safetensors.torch import save_file

    state: Optional[QuantState] = getattr(qmodel, "ptq_state", None)
    if state is None:
        raise ValueError("this model was not made by ptq_protein.quantize (no ptq_state); quantize it first")
    if state.config.study is not None:
        raise ValueError(f"{state.config.name} reproduces the study in float simulation and is not saved as an "
                         "artifact: use it in memory (pp.quantize, eval structure), or save one of our recipes")
    path = Path(path)
    sites = {s.name: e for s in state.sites if (e := _site_entry(qmodel, s)) is not None}
    tensors, aliases = _tensor_dict(qmodel, sites)
    with atomic_dir(path, force=force) as tmp:
        save_file(tensors, str(tmp / TENSORS), metadata={"format": ARTIFACT_FORMAT})
        recipe = {
            "format": ARTIFACT_FORMAT, "format_version": ARTIFACT_VERSION,
            "config": state.config.to_dict(), "family": state.family,
            "architecture": describe_architecture(qmodel),
            "model": dict(model_info or {}),
            "calibration": None if state.calibration is None else state.calibration.to_dict(),
            "sites": sites, "site_list": [s.to_dict() for s in state.sites], "fp_sites": state.fp_sites,
            "aliases": aliases, "versions": _versions(),
            "files": {TENSORS: {"sha256": _sha256(tmp / TENSORS), "bytes": (tmp / TENSORS).stat().st_size}},
        }
        (tmp / RECIPE).write_text(json.dumps(recipe, indent=2, sort_keys=True))
        (tmp / REPORT_JSON).write_text(json.dumps(state.report, indent=2, default=str))
        (tmp / REPORT_MD).write_text(report_markdown(state.report, title=f"{state.config.name} per-site report"))
    return path


def _read_recipe(path: Path) -> Dict[str, Any]:
    if not path.is_dir():
        raise ArtifactError(f"{path} is not an artifact folder (expected {RECIPE} and {TENSORS}); run 'ptq-protein quantize ... --out {path}'")
    try:
        recipe = json.loads((path / RECIPE).read_text())
    except FileNotFoundError as err:
        raise ArtifactError(f"{path} has no {RECIPE}: not a ptq-protein artifact, or an incomplete copy") from err
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{path / RECIPE} is not valid JSON ({err.msg}); the artifact is corrupt: re-run quantize") from err
    if recipe.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{path / RECIPE} is not a ptq-protein recipe")
    if recipe.get("format_version") != ARTIFACT_VERSION:
        raise ArtifactError(f"artifact format version {recipe.get('format_version')} is not supported by this release "
                            f"(expects {ARTIFACT_VERSION}); re-run quantize")
    return recipe


def _verify_tensors(path: Path, recipe: Dict[str, Any]) -> None:
    expected = recipe.get("files", {}).get(TENSORS, {})
    file = path / TENSORS
    if not file.exists():
        raise ArtifactError(f"{file} is missing; the artifact is incomplete: re-run quantize")
    if file.stat().st_size != expected.get("bytes"):
        raise ArtifactError(f"{file} has {file.stat().st_size} bytes but the recipe records {expected.get('bytes')}: "
                            "the file is truncated or was replaced; re-run quantize")
    if _sha256(file) != expected.get("sha256"):
        raise ArtifactError(f"{file} does not match the sha256 in {RECIPE}: the artifact was modified or corrupted; re-run quantize")


def _linear_shell(name: str, entry: Dict[str, Any], tensors: Dict[str, torch.Tensor], backend: Backend) -> QuantLinear:
    wspec = None if entry["weight_spec"] is None else TensorQuant.from_dict(entry["weight_spec"])
    quant = ActQuantizer.from_state(entry["input_quant"]) if "input_quant" in entry else None
    codebook = PiecewiseCodebook.from_dict(entry["weight_codebook"]) if "weight_codebook" in entry else None
    if wspec is not None and f"{name}.weight_packed" in tensors:
        tensors[f"{name}.weight_codes"] = unpack_int4(tensors.pop(f"{name}.weight_packed"), entry["in_features"])
    get = tensors.get
    return QuantLinear(entry["in_features"], entry["out_features"], weight=get(f"{name}.weight"),
                       weight_codes=get(f"{name}.weight_codes"), weight_scale=get(f"{name}.weight_scale"),
                       weight_zero_point=get(f"{name}.weight_zero_point"), weight_spec=wspec,
                       bias=get(f"{name}.bias"), input_quant=quant, backend=backend, weight_codebook=codebook)


def load(path: Union[str, Path], device: str = "cpu", backend: Optional[str] = None) -> nn.Module:
    """Rebuild a quantized model from an artifact folder; outputs equal the saved model's bit for bit."""
    from safetensors.torch import load_file

    path = Path(path)
    recipe = _read_recipe(path)
    _verify_tensors(path, recipe)
    try:
        tensors = load_file(str(path / TENSORS))
    except Exception as err:  # safetensors raises its own error types for malformed files
        raise ArtifactError(f"{path / TENSORS} could not be read ({err}); re-run quantize") from err
    config = QuantConfig.from_dict(recipe["config"])
    if backend is not None:
        config = config.replace(backend=Backend(backend))
    model = build_architecture(recipe["architecture"])
    from ptq_protein.models.adapters import get_adapter

    adapter = get_adapter(model)
    adapter.prepare(model)
    for name, entry in recipe["sites"].items():
        if entry["kind"] == "linear":
            set_module(model, name, _linear_shell(name, entry, tensors, config.backend))
        elif entry["kind"] == "matmul":
            quants = {k: ActQuantizer.from_state(v) for k, v in entry["operands"].items()}
            set_module(model, name, QuantMatmulHost(model.get_submodule(name), name, quants))
        else:
            set_module(model, name, QuantInput(model.get_submodule(name), ActQuantizer.from_state(entry["input_quant"])))
    for alias, target in recipe.get("aliases", {}).items():
        tensors[alias] = tensors[target]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ArtifactError(f"artifact tensors do not fit the architecture (missing {missing[:3]}, unexpected "
                            f"{unexpected[:3]}); the artifact is corrupt or from another release: re-run quantize")
    sites = [Site(s["name"], SiteKind(s["kind"]), s["group"], s["module_type"], s["is_head"]) for s in recipe["site_list"]]
    calib = recipe.get("calibration")
    report = json.loads((path / REPORT_JSON).read_text()) if (path / REPORT_JSON).exists() else []
    model.ptq_state = QuantState(config, recipe["family"], sites, {n: e["kind"] for n, e in recipe["sites"].items()},
                                 None if calib is None else CalibrationInfo(**calib), report, recipe.get("fp_sites", []))
    model.ptq_recipe = recipe
    return model.eval().to(device)
