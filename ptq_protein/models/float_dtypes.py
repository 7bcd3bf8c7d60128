"""The floating dtype a model runs in, recorded in an artifact's sealed recipe and restored on load.

``pp.load(A).half()`` saves float16 tensors; rebuilding the architecture makes float32
modules, so without this record the reload would run in float32 (other outputs). The
record is the dtype most of the model's floating parameters have (key ``""``) and, for
each top-level part that differs (ESMFold's float16 ``esm`` stem), that part's dtype.
Quantizer scales are float32 buffers whatever the model's dtype, so they do not count; nor do the modules a pass
holds in a dtype of its own (marked with :data:`HELD`, e.g. ESMFold's bfloat16 trunk Linears), which the cast on
load leaves as they were loaded.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, Optional

import torch
from torch import nn

from ptq_protein.support.errors import ArtifactError

__all__ = ["FLOAT_DTYPES", "float_dtypes", "apply_float_dtypes", "main_dtype"]

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")  # what a record may name
HELD = "_ptq_held_dtype"  # the attribute ptq_protein.nn.trunk_dtype sets (nn imports models, not the reverse)


def float_dtypes(model: nn.Module) -> Dict[str, str]:
    """``{"": "float16"}``, or ``{"": "float32", "esm": "float16"}`` where a top-level part differs.

    Example: ``float_dtypes(pp.load(A).half()) == {"": "float16"}``.
    """
    main = _dtype_of(model) or torch.float32
    record = {"": _name(main)}
    for name, child in model.named_children():
        dtype = _dtype_of(child)
        if dtype is not None and dtype != main:
            record[name] = _name(dtype)
    return record


def apply_float_dtypes(model: nn.Module, record: Any, where: str) -> nn.Module:
    """Cast ``model`` (then each named part) to the recorded dtypes; ``where`` names the recipe for errors."""
    if record is None:
        return model  # recipes written before the record: the model runs in float32, as they were saved
    if (not isinstance(record, dict) or "" not in record
            or not all(isinstance(k, str) and v in FLOAT_DTYPES for k, v in record.items())):
        raise ArtifactError(f"{where} field dtypes must map module names to one of {', '.join(FLOAT_DTYPES)} "
                            f"(with the key \"\" for the model), not {record!r}: the artifact is corrupt; re-run "
                            "quantize")
    _cast(model, getattr(torch, record[""]))
    for name, dtype in record.items():
        if name:
            try:
                part = model.get_submodule(name)
            except AttributeError as err:
                raise ArtifactError(f"{where} field dtypes names {name!r}, which the model does not have: the "
                                    "artifact is corrupt; re-run quantize") from err
            _cast(part, getattr(torch, dtype))
    return model


def main_dtype(record: Any) -> str:
    """The model's dtype in a record (``"float32"`` where there is none)."""
    return record.get("", "float32") if isinstance(record, dict) else "float32"


def _cast(model: nn.Module, dtype: torch.dtype) -> None:
    """``model.to(dtype)``, leaving held modules (and so never widening them, even for a moment) as they are."""
    if not any(getattr(m, HELD, None) for m in model.modules()):
        model.to(dtype)
        return
    for module in model.modules():
        if not getattr(module, HELD, None):
            module._apply(lambda t: t.to(dtype) if t.is_floating_point() else t, recurse=False)


def _own_parameters(module: nn.Module):
    for sub in module.modules():
        if not getattr(sub, HELD, None):
            yield from sub.parameters(recurse=False)


def _dtype_of(module: nn.Module) -> Optional[torch.dtype]:
    counts = Counter(p.dtype for p in _own_parameters(module) if p.is_floating_point())
    return counts.most_common(1)[0][0] if counts else None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
