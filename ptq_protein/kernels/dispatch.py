"""Choose between a Triton kernel and its exact torch reference.

Every public wrapper takes ``backend=`` (a :class:`Backend` or its string):
``"auto"`` runs Triton on CUDA tensors (and on CPU tensors under
``TRITON_INTERPRET=1``) and the torch reference otherwise; ``"triton"``
insists on the kernel and raises when it cannot run; ``"torch"`` always runs
the reference (what the tests compare against).
"""

from __future__ import annotations

from enum import Enum

import torch

from ptq_protein.kernels._triton import HAS_TRITON, interpreting

__all__ = ["Backend", "resolve_backend"]


class Backend(str, Enum):
    """Where a kernel wrapper computes."""

    AUTO = "auto"
    TRITON = "triton"
    TORCH = "torch"


def resolve_backend(backend: Backend | str, device: torch.device) -> Backend:
    """Resolve ``backend`` for tensors on ``device`` to ``TRITON`` or ``TORCH``.

    Raises
    ------
    ValueError
        For an unknown name, or ``"triton"`` where Triton cannot run.
    """
    try:
        choice = Backend(backend)
    except ValueError as e:
        names = ", ".join(repr(b.value) for b in Backend)
        raise ValueError(f"backend={backend!r} is not one of {names}") from e
    if choice is Backend.TORCH:
        return Backend.TORCH
    runnable = HAS_TRITON and (device.type == "cuda" or interpreting())
    if runnable:
        return Backend.TRITON
    if choice is Backend.TRITON:
        why = "triton is not installed" if not HAS_TRITON else f"the tensors are on {device}"
        raise ValueError(
            f"backend='triton' cannot run: {why}; use CUDA tensors, or set TRITON_INTERPRET=1 before "
            "importing the kernels to run the CPU interpreter, or pass backend='torch'"
        )
    return Backend.TORCH
