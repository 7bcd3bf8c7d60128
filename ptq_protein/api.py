"""The public entry point: ``pp.quantize(model, recipe, calibration=...)``.

Data flows one way: model → sites → calibration statistics → quantizer
parameters → module swap → (artifact, evaluation). The returned model is the
same class as the input, called exactly like it; its quantization record is
``qmodel.ptq_state`` (a :class:`QuantState`).
"""

from __future__ import annotations

import copy
from typing import Optional, Union

from torch import nn

from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.fused_float import use_fast_float_if_integer_
from ptq_protein.models.mapped import mapped_file_of
from ptq_protein.passes.fit_activations import fit_activation_quantizers  # re-exported: public since 0.1
from ptq_protein.passes.float_source import require_float
from ptq_protein.passes.plan import plan_calibration, static_sites
from ptq_protein.passes.recipe import resolve_recipe
from ptq_protein.passes.run import Run
from ptq_protein.passes.sequences import (
    CalibrationArg,
    calibration_records,
    calibration_sequences,
    crop_sequence,
    resolve_calibration,
)
from ptq_protein.passes.state import CalibrationInfo, CalibrationPass, QuantState
from ptq_protein.recipes.config import Backend, QuantConfig
from ptq_protein.recipes.presets import resolve_config
from ptq_protein.support.errors import InputError
from ptq_protein.support.process_memory import computing, loading

__all__ = ["quantize", "QuantState", "CalibrationInfo", "CalibrationPass", "resolve_calibration", "static_sites",
           "calibration_sequences", "calibration_records", "crop_sequence", "fit_activation_quantizers"]


@loading()  # the float weights it replaces are freed: returned, and the heap trimmed after
def quantize(model: nn.Module, config: Union[str, QuantConfig, dict] = "w8a8-pwlq",
             calibration: CalibrationArg = None, *, batch_size: Optional[int] = None, backend: Optional[str] = None,
             inplace: bool = False, progress: bool = False, num_recycles: Optional[int] = None,
             calib_max_length: Optional[int] = None, statistics: Optional[CalibrationPass] = None) -> nn.Module:
    """The recipe driver behind `pp.quantize` (`ptq_protein.search.entry.quantize`), which documents
    every parameter.

    The config's passes (`ptq_protein.passes.recipe`) run in order on one record, after one plan
    of their calibration (`ptq_protein.passes.plan`).
    """
    cfg = _resolved(config, backend)
    adapter = get_adapter(model)
    require_float(model)
    _check_run_options(adapter, calib_max_length, num_recycles)
    qmodel = model if inplace else copy.deepcopy(model)
    # weights memory-mapped by load_model(mmap=True): hand each layer's pages back once used
    mapped = mapped_file_of(qmodel) if inplace else None
    adapter.prepare(qmodel)
    recipe = resolve_recipe(cfg)
    plan = plan_calibration(cfg, recipe.passes, recipe.choose(qmodel, adapter, cfg), statistics)
    info, seqs = plan.calibration_input(adapter, calibration, calib_max_length)
    run = Run(qmodel, adapter, cfg, plan, seqs, info, batch_size, progress,
              {"num_recycles": num_recycles} if num_recycles is not None else {}, mapped)
    with computing():  # calibration forwards reuse their blocks; the float weights the swap frees go back after
        for step in recipe.passes:
            step.run(run)
    qmodel.ptq_state = run.state()
    use_fast_float_if_integer_(qmodel)  # after calibration, which keeps fair-esm's arithmetic in the float layers
    return qmodel


def _resolved(config: Union[str, QuantConfig, dict], backend: Optional[str]) -> QuantConfig:
    """The config, with ``backend`` applied and checked."""
    cfg = resolve_config(config)
    if backend is not None:
        if backend not in {b.value for b in Backend}:
            raise InputError(f"unknown backend {backend!r}; choose one of {', '.join(b.value for b in Backend)}")
        cfg = cfg.replace(backend=Backend(backend))  # QuantConfig checks what backend 'int8' can run
    return cfg


def _check_run_options(adapter, calib_max_length: Optional[int], num_recycles: Optional[int]) -> None:
    """Refuse options that would otherwise be ignored or misread (a negative crop left every site FP)."""
    for name, value, low in (("calib_max_length", calib_max_length, 1), ("num_recycles", num_recycles, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise InputError(f"{name}={value!r} must be None or an integer >= {low}")
    if num_recycles is not None and adapter.family != "hf-esmfold":
        raise InputError(f"num_recycles={num_recycles} only applies to ESMFold; this is a {adapter.family} model: "
                         "drop it")
