"""Rebuild a quantized model from a verified recipe and its tensors: what ``pp.load`` does after the checks.

:func:`ptq_protein.artifact.save_load.load` reads and verifies an artifact, then calls :func:`build_from_recipe`; the
transformers view of a fair-esm artifact (:mod:`ptq_protein.artifact.fair_hf`) calls it on the renamed recipe.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from torch import nn

from ptq_protein.api import CalibrationInfo, QuantState
from ptq_protein.artifact.seal import DTYPES, RECIPE, REPORT_JSON
from ptq_protein.calibration.matmul_sites import QuantMatmulHost
from ptq_protein.calibration.sites import Site, set_module
from ptq_protein.kernels.packing import unpack_int4
from ptq_protein.models.architecture import build_architecture
from ptq_protein.models.float_dtypes import apply_float_dtypes
from ptq_protein.models.fused_float import use_fast_float_if_integer_
from ptq_protein.nn.backend_choice import announce, choose_backend
from ptq_protein.nn.modules import ActQuantizer, QuantInput, QuantLinear
from ptq_protein.nn.pair_int8 import use_pair_int8
from ptq_protein.nn.special_tokens import apply_special_tokens_
from ptq_protein.nn.trunk_dtype import use_trunk_dtype
from ptq_protein.quant.codebook import PiecewiseCodebook
from ptq_protein.recipes.config import Backend, QuantConfig, SiteKind, TensorQuant
from ptq_protein.recipes.site_plan import MixedPlan
from ptq_protein.support.errors import ArtifactError
from ptq_protein.support.process_memory import loading

__all__ = ["build_from_recipe", "warn_if_unfaithful"]

log = logging.getLogger(__name__)


@loading()  # its freed temporaries go back to the system; the heap is trimmed after
def build_from_recipe(recipe: Dict[str, Any], tensors: Dict[str, torch.Tensor], path: Path,
                      backend: Optional[str] = None, device: Any = "cpu") -> nn.Module:
    """The quantized model a verified recipe describes, adopting ``tensors`` (consumed).

    ``backend`` None runs the fastest path whose integer results are exact on ``device``
    (:func:`ptq_protein.nn.backend_choice.choose_backend`, said in one log line per process).
    """
    config = QuantConfig.from_dict(recipe["config"])
    if backend is None:
        chosen, why = choose_backend(config, torch.device(device))
        announce(why)
        config = config.replace(backend=chosen)
    else:
        config = config.replace(backend=Backend(backend))
    model = build_architecture(recipe["architecture"], initialise=False)  # every tensor is loaded below
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
            set_module(model, name,
                       QuantInput(model.get_submodule(name), ActQuantizer.from_state(entry["input_quant"])))
    for alias, target in recipe.get("aliases", {}).items():
        tensors[alias] = tensors[target]
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    if missing or unexpected:
        raise ArtifactError(f"artifact tensors do not fit the architecture (missing {missing[:3]}, unexpected "
                            f"{unexpected[:3]}); the artifact is corrupt or from another release: re-run quantize")
    if config.trunk_dtype is not None:  # before the dtype record's cast, which leaves the trunk's held Linears
        use_trunk_dtype(model, config.trunk_dtype)
    apply_float_dtypes(model, recipe.get(DTYPES), path / RECIPE)  # the dtype it was saved in (.half(), ...)
    apply_special_tokens_(model, adapter, config)
    if config.pair_bits is not None:
        use_pair_int8(model, config.pair_bits)
    use_fast_float_if_integer_(model)  # the layers a recipe keeps in float run fused as its integer ones do
    model.ptq_state = _state(recipe, config, path)
    model.ptq_recipe = recipe
    tensors.clear()  # the skeleton's float weights, replaced above, were freed: loading() trims them
    return model


def _state(recipe: Dict[str, Any], config: QuantConfig, path: Path) -> QuantState:
    sites = [Site(s["name"], SiteKind(s["kind"]), s["group"], s["module_type"],
                  s["is_head"]) for s in recipe["site_list"]]
    calib = recipe.get("calibration")
    report = json.loads((path / REPORT_JSON).read_text())  # verified: a plain file with the sealed sha256
    plan = recipe.get("mixed_precision")
    try:
        plan = None if plan is None else MixedPlan.from_dict(plan)
    except ValueError as err:
        raise ArtifactError(f"{path / RECIPE}: its mixed-precision plan is invalid ({err}); "
                            "re-run quantize --auto") from err
    return QuantState(config, recipe["family"], sites, {n: e["kind"] for n, e in recipe["sites"].items()},
                      None if calib is None else CalibrationInfo(**calib), report, recipe.get("fp_sites", []),
                      plan=plan)


def warn_if_unfaithful(recipe: Dict[str, Any], path: Path) -> None:
    """The quantize check sealed in ``recipe`` was far outside its recipe's bound: say so wherever it loads."""
    found = recipe.get("fidelity")
    found = found.get("verdict") if isinstance(found, dict) else None
    if isinstance(found, dict) and found.get("within") is False:
        log.warning("%s: when it was quantized, its own fidelity check was far outside what its recipe gives (%s): "
                    "its outputs are not a faithful quantization of the model; re-quantize (its README.md shows the "
                    "check)", path, "; ".join(map(str, found.get("outside", []))))


def _linear_shell(name: str, entry: Dict[str, Any], tensors: Dict[str, torch.Tensor], backend: Backend) -> QuantLinear:
    """A QuantLinear of the site's shape and specs on the meta device: ``load`` gives it the read tensors."""
    wspec = None if entry["weight_spec"] is None else TensorQuant.from_dict(entry["weight_spec"])
    quant = ActQuantizer.from_state(entry["input_quant"]) if "input_quant" in entry else None
    codebook = PiecewiseCodebook.from_dict(entry["weight_codebook"]) if "weight_codebook" in entry else None
    if wspec is not None and f"{name}.weight_packed" in tensors:
        tensors[f"{name}.weight_codes"] = unpack_int4(tensors.pop(f"{name}.weight_packed"), entry["in_features"])
    def get(key: str) -> Optional[torch.Tensor]:
        return tensors[key].to("meta") if key in tensors else None

    return QuantLinear(entry["in_features"], entry["out_features"], weight=get(f"{name}.weight"),
                       weight_codes=get(f"{name}.weight_codes"), weight_scale=get(f"{name}.weight_scale"),
                       weight_zero_point=get(f"{name}.weight_zero_point"), weight_spec=wspec,
                       bias=get(f"{name}.bias"), input_quant=quant, backend=backend, weight_codebook=codebook)
