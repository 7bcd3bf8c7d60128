"""Which backend a loaded artifact runs when the caller names none: the fastest whose integers are exact here.

An artifact records the backend it was quantized with (the float simulation, ``fake``, by default), but
that is a property of the run, not of the recipe: the integer codes and scales are the same either way.
On a CPU where oneDNN's int8 GEMM gives exact int32 accumulators (checked once per process by
:func:`ptq_protein.nn.cpu_int8.mode`: natively with VNNI or AMX, or split against the int16 saturation of
AVX2-only CPUs) the integer GEMMs are 1.6-4x faster than the simulation, so they run; a site no exact fast
engine takes runs the simulation's product (``nn.int_exec``). On CUDA the recorded backend runs: the
Triton kernels have not been verified on a GPU yet, so integer GEMMs there stay opt-in (``backend="int8"``).
``backend="fake"`` keeps the simulation of record, bit for bit, anywhere.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import List, Tuple

import torch

from ptq_protein.recipes.config import Backend, QuantConfig

__all__ = ["choose_backend", "where_it_runs", "cpu_isa", "cpu_flags"]

log = logging.getLogger(__name__)

_HOLD_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")  # oneDNN's own knob: its kernels stop at that ISA
_FLAGS = (("amx_int8", "AMX int8"), ("avx512_vnni", "AVX-512 VNNI"), ("avx_vnni", "AVX-VNNI"), ("avx512f", "AVX-512"),
          ("avx2", "AVX2"))


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset:
    """The instruction-set flags this CPU lists in ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        return frozenset(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                              if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration, IndexError):
        return frozenset()


@functools.lru_cache(maxsize=None)
def cpu_isa() -> str:
    """The widest int8-relevant instruction set this CPU lists (``/proc/cpuinfo``), or PyTorch's capability."""
    flags = cpu_flags()
    found = next((name for flag, name in _FLAGS if flag in flags), None)
    return found or torch.backends.cpu.get_cpu_capability()


def choose_backend(config: QuantConfig, device: torch.device) -> Tuple[Backend, str]:
    """(backend, the one-line reason) for an artifact of ``config`` loaded with no backend named.

    A recipe integer GEMMs cannot run (FP8, the study's schemes, codes wider than 8 bits) keeps its recorded
    backend: choosing for it must never turn a loadable artifact into a refusal.
    """
    recorded = config.backend
    try:
        config.replace(backend=Backend.INT8)
    except ValueError as why:
        return recorded, f"the recorded backend '{recorded.value}' (recipe {config.name!r}: {why})"
    if device.type != "cpu":
        return recorded, (f"{device.type}: the recorded backend '{recorded.value}' runs (integer GEMMs on a GPU are "
                          "opt-in, backend='int8': not yet verified on GPU hardware)")
    from ptq_protein.nn import cpu_int8

    mode = cpu_int8.mode()
    if mode is None:
        return Backend.FAKE, f"the float simulation (backend 'fake'): {cpu_int8.reason()}"
    held = _onednn_held()
    isa = f"held to {held} by {_HOLD_VARS[0]} (this CPU: {cpu_isa()})" if held else f"on {cpu_isa()}"
    how = "natively" if mode == "native" else \
        f"split against the int16 saturation of {'that ISA' if held else 'this CPU'} (no VNNI)"
    return Backend.INT8, (f"integer GEMMs (backend 'int8', oneDNN {isa}: exact int32 accumulation, {how}); "
                          "backend='fake' runs the float simulation instead")


def where_it_runs(config: QuantConfig) -> List[str]:
    """What a load of an artifact of ``config`` with no backend named runs, per device, in words: the rules of
    :func:`choose_backend` without probing this machine (an artifact's card travels to others)."""
    recorded = config.backend.value
    try:
        config.replace(backend=Backend.INT8)
    except ValueError as why:
        return [f"anywhere: the recorded backend '{recorded}' (integer GEMMs cannot run this recipe: {why})"]
    return ["a CPU where oneDNN's int8 GEMM is exact (VNNI or AMX natively; AVX2 split against its int16 "
            "saturation; every x86-64 CPU tried): integer GEMMs (backend 'int8'); a PyTorch without an exact "
            "oneDNN int8 GEMM: the float simulation (backend 'fake')",
            f"CUDA: the recorded backend '{recorded}' (integer GEMMs on a GPU are opt-in, backend='int8': not yet "
            "verified on GPU hardware)",
            "backend='fake' (--backend fake), anywhere: the float simulation of record, bit for bit"]


def _onednn_held() -> str:
    """The instruction set oneDNN is held to (``ONEDNN_MAX_CPU_ISA``, or its old name ``DNNL_MAX_CPU_ISA``), or ""."""
    return next((os.environ[name].strip() for name in _HOLD_VARS if os.environ.get(name, "").strip()), "")


@functools.lru_cache(maxsize=None)
def announce(reason: str) -> None:
    """Say once per process which path artifacts run and why."""
    log.info("running %s", reason)
