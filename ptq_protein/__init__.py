"""ptq-protein: post-training quantization for protein language models (ESM-2, ESMFold).

    import ptq_protein as pp
    qmodel = pp.quantize(model, "w8a8-pwlq", calibration="casp14:50")
    pp.save(qmodel, "runs/w8a8"); qmodel = pp.load("runs/w8a8")
    qmodel = pp.quantize(model, "auto", calibration="casp14:50", budget="tm>=0.99")  # mixed precision
    pp.sensitivity(model, "w8a8-pwlq", "cameo139:5", metric="tm", out_dir="runs/sens")

Attributes are imported lazily so that ``import ptq_protein`` (and the CLI's
``--help``) stays fast.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ptq_protein import _compat

__version__ = "0.1.0"

_EXPORTS = {
    "quantize": "ptq_protein.search.entry",
    "sensitivity": "ptq_protein.search.sensitivity",
    "QuantState": "ptq_protein.api",
    "QuantConfig": "ptq_protein.recipes.config",
    "TensorQuant": "ptq_protein.recipes.config",
    "Scheme": "ptq_protein.recipes.config",
    "Granularity": "ptq_protein.recipes.config",
    "RangeMethod": "ptq_protein.recipes.config",
    "BreakpointMethod": "ptq_protein.recipes.config",
    "SiteKind": "ptq_protein.recipes.config",
    "Backend": "ptq_protein.recipes.config",
    "Engine": "ptq_protein.recipes.config",
    "set_engine": "ptq_protein.nn.int_exec",
    "engine_used": "ptq_protein.nn.int_exec",
    "PRESETS": "ptq_protein.recipes.presets",
    "get_preset": "ptq_protein.recipes.presets",
    "save": "ptq_protein.artifact.save_load",
    "load": "ptq_protein.artifact.save_load",
    "compare_models": "ptq_protein.eval.bench.fidelity",
    "load_model": "ptq_protein.models.loading",
    "export_onnx": "ptq_protein.interop.onnx_export",
    "read_embeddings": "ptq_protein.workloads.embed_store",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # what __getattr__ returns, for type checkers and the API reference (test_layout: the same names)
    from ptq_protein.api import QuantState as QuantState
    from ptq_protein.artifact.save_load import load as load
    from ptq_protein.artifact.save_load import save as save
    from ptq_protein.eval.bench.fidelity import compare_models as compare_models
    from ptq_protein.interop.onnx_export import export_onnx as export_onnx
    from ptq_protein.models.loading import load_model as load_model
    from ptq_protein.nn.int_exec import engine_used as engine_used
    from ptq_protein.nn.int_exec import set_engine as set_engine
    from ptq_protein.recipes.config import Backend as Backend
    from ptq_protein.recipes.config import BreakpointMethod as BreakpointMethod
    from ptq_protein.recipes.config import Engine as Engine
    from ptq_protein.recipes.config import Granularity as Granularity
    from ptq_protein.recipes.config import QuantConfig as QuantConfig
    from ptq_protein.recipes.config import RangeMethod as RangeMethod
    from ptq_protein.recipes.config import Scheme as Scheme
    from ptq_protein.recipes.config import SiteKind as SiteKind
    from ptq_protein.recipes.config import TensorQuant as TensorQuant
    from ptq_protein.recipes.presets import PRESETS as PRESETS
    from ptq_protein.recipes.presets import get_preset as get_preset
    from ptq_protein.search.entry import quantize as quantize
    from ptq_protein.search.sensitivity import sensitivity as sensitivity
    from ptq_protein.workloads.embed_store import read_embeddings as read_embeddings

_compat.install()


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ptq_protein' has no attribute {name!r}")


from ptq_protein.interop import hf_hook  # noqa: E402 (after __version__: registering may import the artifact code)

hf_hook.install()
