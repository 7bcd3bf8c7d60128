"""An official model name is a claim about shapes: a file of other shapes under it is refused.

``load_model("esm2_t6_8M_UR50D", weights=f)`` with ``f`` a 35M file would otherwise
be recorded, reported and compared as the 8M model. Only the published names are
checked (a path, or any other name, is taken as it is); the sizes are the
published architectures (fair-esm ``esm/pretrained.py``; layers are also in the
name, ``t6`` = 6 layers).
"""

from __future__ import annotations

from typing import Tuple

from torch import nn

from ptq_protein.support.errors import InputError

__all__ = ["PUBLISHED_SIZES", "check_name_fits"]

#: name -> (layers, embedding width) of the published ESM language models.
PUBLISHED_SIZES = {
    "esm2_t6_8M_UR50D": (6, 320), "esm2_t12_35M_UR50D": (12, 480), "esm2_t30_150M_UR50D": (30, 640),
    "esm2_t33_650M_UR50D": (33, 1280), "esm2_t36_3B_UR50D": (36, 2560), "esm2_t48_15B_UR50D": (48, 5120),
    "esm1b_t33_650M_UR50S": (33, 1280),
    **{f"esm1v_t33_650M_UR90S_{i}": (33, 1280) for i in range(1, 6)},
    "esmc_300m": (30, 960), "esmc_600m": (36, 1152),  # EvolutionaryScale's esm/pretrained.py
}


def check_name_fits(name: str, model: nn.Module, where: str) -> None:
    """Raise :class:`InputError` when ``name`` (``esm2_*`` or ``facebook/esm2_*``) is published with other sizes."""
    short = name.split("/", 1)[1] if name.startswith("facebook/") else name
    wanted = PUBLISHED_SIZES.get(short)
    if wanted is None:
        return
    found = _sizes(model)
    if found != wanted:
        raise InputError(f"{where} holds an ESM model of {found[0]} layers x {found[1]} wide, but {name} is "
                         f"{wanted[0]} x {wanted[1]}: the name does not fit the file; give the matching name, or "
                         "load the file by its path (or under a name of your own) to use it as it is")


def _sizes(model: nn.Module) -> Tuple[int, int]:
    """(layers, width): transformers from its config, ESM C from its sizes, fair-esm (ESM2, ESM-1) from its modules."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "num_hidden_layers"):
        return int(config.num_hidden_layers), int(config.hidden_size)
    if hasattr(model, "d_model"):  # ptq_protein.models.esmc.ESMC
        return int(model.num_layers), int(model.d_model)
    return len(model.layers), int(model.embed_tokens.embedding_dim)
