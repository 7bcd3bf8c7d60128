"""The environment variables ptq-protein reads and their valid values (no torch import: the CLI checks them first).

A bad value read in the middle of a run would fail every row of it (each recorded as an error, exit 0);
:func:`check_environment` refuses it before any work, in one line naming the variable.
"""

from __future__ import annotations

import os

from ptq_protein.support.io_utils import env_flag

__all__ = ["SKIP_MEMORY_CHECK", "FUSED", "FUSED_MODES", "fused_mode", "check_environment"]

SKIP_MEMORY_CHECK = "PTQ_PROTEIN_SKIP_MEMORY_CHECK"  # yes/no: skip the default memory check of fold/embed
FUSED = "PTQ_PROTEIN_FUSED"  # when fake quantizers run through torch.compile
FUSED_MODES = ("auto", "on", "off")


def fused_mode() -> str:
    """``PTQ_PROTEIN_FUSED`` as one of :data:`FUSED_MODES` (unset: ``auto``); another value is a ValueError."""
    raw = os.environ.get(FUSED, "")
    mode = raw.strip().lower() or "auto"
    if mode not in FUSED_MODES:
        raise ValueError(f"{FUSED}={raw!r} is not one of {', '.join(FUSED_MODES)}; set one of them, or unset it")
    return mode


def check_environment() -> None:
    """Every variable above, checked (raises the ValueError of the first bad one)."""
    env_flag(SKIP_MEMORY_CHECK)
    fused_mode()
