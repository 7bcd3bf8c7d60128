"""Coordinate arrays given by a caller (numpy or torch, any device) as atom37 arrays and their mask."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ptq_protein.eval.atoms import ATOM37_NAMES, C_INDEX, CA_INDEX, N_INDEX
from ptq_protein.support.errors import InputError

__all__ = ["atom37_from_arrays"]


def _to_numpy(value: Any, name: str, source: str) -> Optional[np.ndarray]:
    if value is None:
        return None
    if hasattr(value, "detach"):  # torch tensor on any device
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise InputError(f"{source}: {name} is not a numeric array ({err})") from err


def atom37_from_arrays(ca, n, c, atom37, atom37_mask, source: str) -> tuple:
    """``(coords [L, 37, 3], mask [L, 37])`` from full atom37 arrays or from CA (with optional N and C)."""
    coords = _to_numpy(atom37, "atom37", source)
    if coords is not None:
        if coords.ndim != 3 or coords.shape[1:] != (37, 3):
            raise InputError(f"{source}: atom37 must have shape [L, 37, 3], got {coords.shape}")
        mask = (np.isfinite(coords).all(-1) if atom37_mask is None
                else np.asarray(_to_numpy(atom37_mask, "atom37_mask", source), dtype=bool))
        return np.nan_to_num(coords, nan=0.0), mask
    backbone = {CA_INDEX: _to_numpy(ca, "ca", source), N_INDEX: _to_numpy(n, "n", source),
                C_INDEX: _to_numpy(c, "c", source)}
    if backbone[CA_INDEX] is None:
        raise InputError(f"{source}: give ca=[L, 3] or atom37=[L, 37, 3] coordinates")
    length = backbone[CA_INDEX].shape[0]
    coords = np.zeros((length, 37, 3))
    mask = np.zeros((length, 37), dtype=bool)
    for slot, xyz in backbone.items():
        if xyz is None:
            continue
        if xyz.shape != (length, 3):
            raise InputError(f"{source}: {ATOM37_NAMES[slot]} coordinates must have shape [{length}, 3], "
                             f"got {xyz.shape}")
        present = np.isfinite(xyz).all(-1)
        coords[present, slot] = xyz[present]
        mask[:, slot] = present
    return coords, mask
