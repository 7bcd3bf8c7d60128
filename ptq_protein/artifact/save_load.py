"""Save and reload quantized models as a folder: safetensors + JSON, never pickles.

Layout of an artifact folder::

    model.safetensors   integer weight codes (int8; <=4-bit packed two per byte as uint8; FP8
                        recipes store float8_e4m3fn / float8_e5m2 codes, safetensors' F8 types),
                        their scales / zero points, activation scales / zero points /
                        PWLQ codebook tensors, and every tensor kept in floating point
    recipe.json         config, per-site quantizer specs, architecture, model source and
                        checksum, calibration set and sha256, versions, tensor-file checksum
    report.json / .md   per-site statistics
    README.md           model card (source, recipe in words, calibration, fidelity, how to load)
    config.json         transformers models only: their config plus a ``quantization_config``, so
                        ``from_pretrained`` opens the folder (:mod:`ptq_protein.artifact.hf_files`)
    vocab.txt, ...      the source folder's tokenizer files, where it had them (sha256 sealed)

Saving is atomic (temp folder, then rename; an existing folder is replaced only
with ``force`` and only when it is an artifact). Loading verifies everything
before building the model: the tensor file's size and sha256, and that every
field of ``recipe.json`` equals the copy sealed in the tensor file's header
(:mod:`ptq_protein.artifact.seal`), so an edited scale, bit width or backend is
refused with the field's name, and that every tensor matches the sealed digest
``tensors_sha256``. Only regular files inside the folder are read. Versions 1 (no
seal) and 2 (tensors not bound) are refused: re-quantize.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import platform
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import nn

from ptq_protein import __version__
from ptq_protein.api import QuantState
from ptq_protein.artifact.build import build_from_recipe, warn_if_unfaithful
from ptq_protein.artifact.hf_files import (
    HF_CONFIG,
    TOKENIZER_FILES,
    copy_tokenizer_files,
    hf_config,
    tokenizer_source,
    write_esm_tokenizer,
)
from ptq_protein.artifact.model_card import CARD, model_card
from ptq_protein.artifact.seal import (
    DTYPES,
    RECIPE,
    REPORT_JSON,
    REPORT_MD,
    SEAL_KEY,
    TENSORS,
    TENSORS_DIGEST,
    canonical_json,
    check_files_entry,
    check_recipe_object,
    check_sealed,
    check_tensors,
    file_sha256,
    plain_file,
    tensors_sha256,
)
from ptq_protein.artifact.tensors import check_header, map_tensors, read_tensors
from ptq_protein.calibration.matmul_sites import QuantMatmulHost
from ptq_protein.calibration.sites import Site
from ptq_protein.kernels.packing import pack_int4
from ptq_protein.models.architecture import describe_architecture
from ptq_protein.models.float_dtypes import float_dtypes, main_dtype
from ptq_protein.models.mapped import MappedFile, attach_mapping
from ptq_protein.nn.modules import QuantInput, QuantLinear
from ptq_protein.passes.recipe import resolve_recipe
from ptq_protein.passes.site_report import report_markdown
from ptq_protein.recipes.config import Backend, QuantConfig
from ptq_protein.support.errors import ArtifactError
from ptq_protein.support.io_utils import atomic_dir, check_out_path, public_source
from ptq_protein.support.process_memory import loading

__all__ = ["save", "load", "is_artifact_dir", "check_artifact_out", "ARTIFACT_FORMAT", "ARTIFACT_VERSION"]

log = logging.getLogger(__name__)

ARTIFACT_FORMAT = "ptq-protein-artifact"
ARTIFACT_VERSION = 3  # 3: the seal binds the tensors' digest too; 2: recipe sealed, tensors not; 1 had no seal


# everything save() writes: all that --force may replace
ARTIFACT_FILES = (TENSORS, RECIPE, REPORT_JSON, REPORT_MD, CARD, HF_CONFIG) + TOKENIZER_FILES


def is_artifact_dir(path: Union[str, Path]) -> bool:
    """True for a folder whose recipe.json says it is a ptq-protein artifact (any version): never write into it."""
    try:
        recipe = json.loads((Path(path) / RECIPE).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return Path(path).is_dir() and isinstance(recipe, dict) and recipe.get("format") == ARTIFACT_FORMAT


def _replaceable_artifact(path: Path) -> bool:
    """What ``--force`` may replace: an artifact folder holding only the files an artifact consists of.

    A folder with anything else (a user's notes, predictions) is refused, naming the first such file, so
    ``--force`` never deletes what it did not write.
    """
    if path.is_symlink() or (path / RECIPE).is_symlink() or not is_artifact_dir(path):
        return False
    foreign = sorted(p.name for p in path.iterdir()
                     if p.name not in ARTIFACT_FILES or not p.is_file() or p.is_symlink())
    if foreign:
        raise FileExistsError(f"{path} holds {foreign[0]!r}, which is not part of a ptq-protein artifact; --force "
                              "replaces only an artifact's own files: move it away or choose another path")
    return True


def check_artifact_out(path: Union[str, Path], force: bool = False) -> None:
    """Refuse an artifact destination that cannot be written, or may not be replaced, before quantizing."""
    check_out_path(path, force=force, replaceable=_replaceable_artifact, what="ptq-protein artifact folder")


_OPTIONAL_DISTRIBUTIONS = {"transformers": "transformers", "esm": "fair-esm"}


def _versions() -> Dict[str, str]:
    """Versions of the libraries that shape an artifact; optional ones only where installed.

    A module already imported reports its own ``__version__``; otherwise the installed
    distribution's metadata is read, without importing it (importing transformers just to
    read its version cost 2.4 s of a fair-esm run).
    """
    out = {"ptq_protein": __version__, "torch": torch.__version__, "python": platform.python_version()}
    for mod, dist in _OPTIONAL_DISTRIBUTIONS.items():
        loaded = sys.modules.get(mod)
        try:
            out[mod] = loaded.__version__ if loaded is not None else importlib.metadata.version(dist)
        except (AttributeError, importlib.metadata.PackageNotFoundError):  # record only what is installed
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


def check_saveable(config: QuantConfig) -> None:
    """Refuse a recipe no artifact can hold (the study reproductions): ask before calibrating, not after."""
    if not resolve_recipe(config).saved:
        raise ValueError(f"{config.name} reproduces the study in float simulation and is not saved as an "
                         "artifact: use it in memory (pp.quantize, eval structure), or save one of our recipes")


def save(qmodel: nn.Module, path: Union[str, Path], *, force: bool = False,
         model_info: Optional[Dict[str, Any]] = None, fidelity_markdown: Optional[str] = None,
         fidelity: Optional[Dict[str, Any]] = None) -> Path:
    """Write `qmodel` (from `ptq_protein.quantize`) to the folder `path`, atomically.

    `fidelity_markdown` (a table) goes into the model card's fidelity section. `fidelity`, the
    quantize check's metrics and verdict (`ptq_protein.workflows.fidelity_bound`), is sealed into the
    recipe; `load` warns when it says the check was outside its recipe's bound.
    """
    from safetensors.torch import save_file

    state: Optional[QuantState] = getattr(qmodel, "ptq_state", None)
    if state is None:
        raise ValueError("this model was not made by ptq_protein.quantize (no ptq_state); quantize it first")
    check_saveable(state.config)
    path = Path(path)
    sites = {s.name: e for s in state.sites if (e := _site_entry(qmodel, s)) is not None}
    tensors, aliases = _tensor_dict(qmodel, sites)
    with atomic_dir(path, force=force, replaceable=_replaceable_artifact, what="ptq-protein artifact folder") as tmp:
        (tmp / REPORT_JSON).write_text(json.dumps(state.report, indent=2, default=str))
        (tmp / REPORT_MD).write_text(report_markdown(state.report, title=f"{state.config.name} per-site report"))
        tokenizer = copy_tokenizer_files(tokenizer_source(qmodel, model_info), tmp)
        recipe = {
            "format": ARTIFACT_FORMAT, "format_version": ARTIFACT_VERSION,
            "config": state.config.to_dict(), "family": state.family,
            "architecture": describe_architecture(qmodel),
            "model": {k: public_source(v) if k in ("name", "source") else v for k, v in (model_info or {}).items()},
            "calibration": None if state.calibration is None else state.calibration.to_dict(),
            "sites": sites, "site_list": [s.to_dict() for s in state.sites], "fp_sites": state.fp_sites,
            "aliases": aliases, "versions": _versions(),
            "reports": {name: file_sha256(tmp / name) for name in (REPORT_JSON, REPORT_MD)},
            "mixed_precision": None if state.plan is None else state.plan.to_dict(),
            TENSORS_DIGEST: tensors_sha256(tensors), DTYPES: float_dtypes(qmodel),
            **({"tokenizer_files": tokenizer} if tokenizer else {}),  # absent without: older recipes unchanged
            **({"fidelity": fidelity} if fidelity is not None else {}),
        }
        recipe = json.loads(json.dumps(recipe))  # exactly what recipe.json will hold (tuples -> lists)
        save_file(tensors, str(tmp / TENSORS), metadata={"format": ARTIFACT_FORMAT, SEAL_KEY: canonical_json(recipe)})
        recipe["files"] = {TENSORS: {"sha256": file_sha256(tmp / TENSORS), "bytes": (tmp / TENSORS).stat().st_size}}
        (tmp / RECIPE).write_text(json.dumps(recipe, indent=2, sort_keys=True))
        config = hf_config(qmodel, state.config.name, ARTIFACT_VERSION, main_dtype(recipe[DTYPES]))
        if config is not None:
            (tmp / HF_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
        if config is not None and recipe["architecture"]["library"] == "fair-esm":
            write_esm_tokenizer(tmp)  # not sealed: checked when transformers opens it (artifact_fair_hf)
        (tmp / CARD).write_text(model_card(recipe, fidelity_markdown))
    return path


def _read_recipe(path: Path) -> Dict[str, Any]:
    if not path.is_dir():
        raise ArtifactError(f"{path} is not an artifact folder (expected {RECIPE} and {TENSORS}); run 'ptq-protein "
                            f"quantize ... --out {path}'")
    if not (path / RECIPE).exists() and not (path / RECIPE).is_symlink():
        raise ArtifactError(f"{path} has no {RECIPE}: not a ptq-protein artifact, or an incomplete copy")
    try:
        recipe = json.loads(plain_file(path, RECIPE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ArtifactError(f"{path / RECIPE} is not valid JSON ({getattr(err, 'msg', type(err).__name__)}); the "
                            "artifact is corrupt: re-run quantize") from err
    check_recipe_object(recipe, path / RECIPE)
    if recipe.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{path / RECIPE} field format is {recipe.get('format')!r}, not {ARTIFACT_FORMAT!r}: "
                            "not a ptq-protein recipe")
    version = recipe.get("format_version")
    if version in (1, 2):
        unsealed = "its recipe.json is not sealed" if version == 1 else "its seal does not cover the tensors"
        raise ArtifactError(f"{path} is a format-{version} artifact: {unsealed}, so its quantizer parameters cannot "
                            "be verified; re-run quantize with this release to make a verifiable one")
    if version != ARTIFACT_VERSION:
        raise ArtifactError(f"{path / RECIPE} field format_version is {version!r}; this release reads "
                            f"{ARTIFACT_VERSION}: re-run quantize")
    return recipe


def _verify(path: Path, recipe: Dict[str, Any]) -> None:
    """Tensor file size and sha256, recipe body against its sealed copy, report checksums."""
    from safetensors import safe_open

    expected = check_files_entry(recipe, TENSORS, path / RECIPE)
    file = plain_file(path, TENSORS)
    if file.stat().st_size != expected["bytes"]:
        raise ArtifactError(f"{file} has {file.stat().st_size} bytes but {RECIPE} field files/{TENSORS}/bytes records "
                            f"{expected['bytes']}: the file is truncated or was replaced; re-run quantize")
    if file_sha256(file) != expected["sha256"]:
        raise ArtifactError(f"{file} does not match {RECIPE} field files/{TENSORS}/sha256: the artifact was modified "
                            "or corrupted; re-run quantize")
    check_header(file)
    try:
        with safe_open(str(file), framework="pt") as handle:
            sealed = (handle.metadata() or {}).get(SEAL_KEY)
    except Exception as err:  # safetensors raises its own error types for malformed headers
        raise ArtifactError(f"{file} could not be read ({err}); re-run quantize") from err
    check_sealed(recipe, sealed, path / RECIPE, file)
    reports = recipe.get("reports")
    if not isinstance(reports, dict) or set(reports) != {REPORT_JSON, REPORT_MD}:
        raise ArtifactError(f"{path / RECIPE} field reports must list exactly {REPORT_JSON} and {REPORT_MD}; the "
                            "artifact is corrupt: re-run quantize")
    tokenizer = recipe.get("tokenizer_files", {})
    if not isinstance(tokenizer, dict) or not set(tokenizer) <= set(TOKENIZER_FILES):
        raise ArtifactError(f"{path / RECIPE} field tokenizer_files must map tokenizer file names to sha256; the "
                            "artifact is corrupt: re-run quantize")
    for name, sha in {**reports, **tokenizer}.items():
        if not (path / name).exists() and not (path / name).is_symlink():
            raise ArtifactError(f"{path / name} is missing; the artifact was modified: re-run quantize (or restore "
                                "the file)")
        if file_sha256(plain_file(path, name)) != sha:
            field = "reports" if name in reports else "tokenizer_files"
            raise ArtifactError(f"{path / name} is missing or differs from {RECIPE} field {field}/{name}: the artifact "
                                "was modified; re-run quantize (or restore the file)")


@loading()  # its freed temporaries go back to the system; the heap is trimmed after
def load(path: Union[str, Path], device: str = "cpu", backend: Optional[str] = None,
         engine: str = "auto", mapped: bool = False) -> nn.Module:
    """Rebuild a quantized model from an artifact folder.

    `backend` None (default) runs the fastest path whose integer results are exact here: oneDNN's integer
    GEMMs on CPUs where they are exact, else the recorded backend (`ptq_protein.nn.backend_choice`; one log
    line says which and why). `backend="fake"` gives outputs equal to a fake-backend saved model's bit for bit.

    `engine` picks the integer GEMM of `backend="int8"` sites (`"auto"`: the
    oneDNN fast path on CPU where it runs, else the exact reference; see
    `ptq_protein.nn.int_exec`); `pp.engine_used(model)` says which ran.

    `mapped=True` (CPU only) keeps the tensors in a private mapping of the tensor file instead of reading
    them into memory: the weights a layer uses as stored are then the file's pages, read from the page
    cache when used, and a caller that runs layers once per pass can hand their pages back after each
    (`ptq_protein.models.mapped`; `ptq-protein fold` does, so a fold holds about one trunk block's
    weights). Outputs are the same either way.
    """
    from ptq_protein.nn.int_exec import parse_engine, set_engine

    engine = parse_engine(engine)
    path = Path(path)
    _check_device(device)
    if backend is not None and backend not in {b.value for b in Backend}:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(b.value for b in Backend)}")
    if mapped and torch.device(device).type != "cpu":
        raise ValueError(f"mapped=True keeps the weights in a mapping of the file, in CPU memory; device {device!r} "
                         "needs them copied: load with mapped=False")
    handle = None
    if mapped:
        recipe, tensors, handle = read_verified_mapped(path)
    else:
        recipe, tensors = read_verified(path)
    model = build_from_recipe(recipe, tensors, path, backend, device)
    if handle is not None:
        handle.release_all()  # pages the build touched: the forward reads them back when it needs them
        attach_mapping(model, handle)
    return set_engine(model.eval().to(device), engine)


def verified_recipe(path: Union[str, Path]) -> Dict[str, Any]:
    """The artifact's recipe after every seal check, without reading its tensors (an engine that caches what it
    built from them checks first that they are still the sealed ones)."""
    path = Path(path)
    recipe = _read_recipe(path)
    _verify(path, recipe)
    return recipe


def read_verified(path: Path) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
    """The artifact's recipe and tensors, each checked against the seal (see the module docstring)."""
    recipe = _sealed_recipe(path)
    tensors = read_tensors(path / TENSORS)  # owned, read once: the model adopts them (no second copy)
    check_tensors(recipe, tensors, path / RECIPE, path / TENSORS)
    return recipe, tensors


def read_verified_mapped(path: Path) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor], MappedFile]:
    """As :func:`read_verified`, the tensors views of one private mapping of the tensor file (:func:`map_tensors`).

    Each tensor's pages are handed back once the seal's digest has read them, so checking a file does not
    leave it resident. A file rewritten in place afterwards (never by ``quantize``, which replaces the
    folder) would be read as it is then: the seal covers the bytes read here.
    """
    recipe = _sealed_recipe(path)
    tensors = map_tensors(path / TENSORS)
    handle = MappedFile(tensors.values()) if tensors else None
    check_tensors(recipe, tensors, path / RECIPE, path / TENSORS, after=None if handle is None else handle.release_one)
    return recipe, tensors, handle


def _sealed_recipe(path: Path) -> Dict[str, Any]:
    """The artifact's recipe once its files match the seal (warned when the recipe is not study-faithful)."""
    recipe = _read_recipe(path)
    _verify(path, recipe)
    warn_if_unfaithful(recipe, path)
    return recipe


def _check_device(device: Any) -> None:
    """Refuse a device this machine cannot use before reading anything (one line, not a CUDA traceback)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a torch device; use 'cpu' or 'cuda[:N]'") from err
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if dev.index is not None and dev.index >= count or count == 0:
            raise ValueError(f"device {device!r} is not available here ({count} CUDA device(s) visible); "
                             "use device='cpu'")
