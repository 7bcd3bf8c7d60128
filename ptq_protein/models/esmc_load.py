"""ESM C checkpoints (the official ``esmc_*_2024_12_v0.pth`` layout) -> :class:`~ptq_protein.models.esmc.ESMC`.

A published ESM C file is a bare state dict (EvolutionaryScale's ``esm/pretrained.py`` reads it with
``torch.load`` and ``load_state_dict``), with no config. Width and depth are read from its shapes; the head
count is in no shape, and both published models use 64-wide heads (960 = 15 x 64, 1152 = 18 x 64), so a
file's heads are its width / 64. The model is built with torch's initialisers skipped (its tensors are never
written, so never resident; building on the meta device instead imported torch's compiler stack, 1.1 s) and the
file's tensors become its parameters (``assign=True``): the weights exist once. A file in another dtype
(bfloat16) keeps it here; ``load_model`` then casts the model to the dtype asked for.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Tuple

import torch

from ptq_protein.models.esmc import ESMC
from ptq_protein.models.esmfold_convert import load_checked
from ptq_protein.models.no_init import skip_torch_init
from ptq_protein.support.errors import InputError

__all__ = ["ESMC_HEAD_WIDTH", "PUBLISHED_ESMC", "is_esmc_state", "refuse_partial_esmc", "esmc_sizes", "load_esmc"]

ESMC_HEAD_WIDTH = 64
#: name -> (d_model, n_heads, n_layers) of the published models (esm/pretrained.py ESMC_300M_202412 / _600M_).
PUBLISHED_ESMC = {"esmc_300m": (960, 15, 30), "esmc_600m": (1152, 18, 36)}
_MARK = "transformer.blocks.0.attn.layernorm_qkv.1.weight"
_BLOCK = re.compile(r"^transformer\.blocks\.(\d+)\.")


def is_esmc_state(data: Any) -> bool:
    """True for a state dict in ESM C's layout (its first block's fused QKV weight is there)."""
    return isinstance(data, dict) and torch.is_tensor(data.get(_MARK)) and torch.is_tensor(data.get("embed.weight"))


def refuse_partial_esmc(data: Any, where: str) -> None:
    """Refuse, in ESM C's words, a state dict in ESM C's layout (``transformer.blocks.*`` keys) that
    :func:`is_esmc_state` does not accept, or one nested under a key: it would otherwise be told it is no
    fair-esm checkpoint."""
    if not isinstance(data, dict):
        return
    nested = next((key for key, value in data.items() if _esmc_layout(value)), None)
    if nested is not None:
        raise InputError(f"{where}: an ESM C state dict nested under {nested!r}; ptq-protein reads ESM C files in "
                         f"the official layout, the state dict itself: save data[{nested!r}] with torch.save")
    if not _esmc_layout(data):
        return
    lacking = [key for key in ("embed.weight", _MARK) if not torch.is_tensor(data.get(key))]
    raise InputError(f"{where}: an ESM C state dict (transformer.blocks.* keys) without the tensor(s) {lacking}; the "
                     "file is incomplete or damaged: re-download it")


def _esmc_layout(data: Any) -> bool:
    return isinstance(data, dict) and any(isinstance(k, str) and k.startswith("transformer.blocks.") for k in data)


def esmc_sizes(state: Dict[str, torch.Tensor], where: str) -> Tuple[int, int, int]:
    """(d_model, n_heads, n_layers) read from the shapes of an ESM C state dict."""
    d_model = int(state["embed.weight"].shape[1])
    n_layers = 1 + max(int(m.group(1)) for key in state if (m := _BLOCK.match(key)))
    if d_model % ESMC_HEAD_WIDTH:
        raise InputError(f"{where}: an ESM C state dict {d_model} wide, which is no multiple of the published "
                         f"models' {ESMC_HEAD_WIDTH}-wide heads, so its head count is unknown; build "
                         "ptq_protein.models.esmc.ESMC(d_model, n_heads, n_layers) and load it yourself")
    return d_model, d_model // ESMC_HEAD_WIDTH, n_layers


def load_esmc(state: Dict[str, torch.Tensor], where: str) -> ESMC:
    """The ESM C model in eval mode holding ``state``'s tensors (no copy); one :class:`InputError` names every key
    that does not fit."""
    d_model, n_heads, n_layers = esmc_sizes(state, where)
    with skip_torch_init():  # uninitialised CPU tensors, never touched: replaced below
        model = ESMC(d_model, n_heads, n_layers)
    load_checked(model, state, where=where, assign=True,
                 fix="the file is damaged or not an ESM C checkpoint: re-download it")
    return model.eval()
