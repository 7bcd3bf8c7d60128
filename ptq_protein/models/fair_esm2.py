"""fair-esm ESM-2 checkpoints -> ``esm.model.esm2.ESM2`` without a second copy of the weights.

fair-esm's own loader builds a randomly initialised model and copies the
checkpoint into it, so the model and the checkpoint both sit in memory (2x the
file). Here the model is built on torch's ``meta`` device (no storage at all)
and the checkpoint's tensors become its parameters
(``load_state_dict(assign=True)``): the weights exist once. The result equals
fair-esm's ``load_model_and_alphabet_core`` bit for bit (tested), including the
tie of the LM head to the token embedding and the warning when the
contact-regression weights are absent (fair-esm then keeps them random).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch

from ptq_protein.models.esmfold_convert import load_checked
from ptq_protein.models.no_init import skip_torch_init
from ptq_protein.support.errors import InputError

__all__ = ["esm2_skeleton", "fair_esm2_state", "fill_missing_regression", "load_fair_esm2", "save_fair_esm2"]

_FAIR_PREFIXES = re.compile(r"^(encoder\.sentence_encoder\.|encoder\.)")  # fair-esm's upgrade_state_dict
_REGRESSION = ("contact_head.regression.weight", "contact_head.regression.bias")


def esm2_skeleton(data: Dict[str, Any], path: Path) -> Tuple[torch.nn.Module, Any]:
    """(``ESM2`` with uninitialised weights, its alphabet) from a fair-esm checkpoint's ``cfg``."""
    import esm
    from esm.model.esm2 import ESM2

    try:
        cfg = data["cfg"]["model"]
        sizes = dict(num_layers=cfg.encoder_layers, embed_dim=cfg.encoder_embed_dim,
                     attention_heads=cfg.encoder_attention_heads, token_dropout=cfg.token_dropout)
    except (AttributeError, KeyError, TypeError) as e:
        raise InputError(f"{path}: not a fair-esm checkpoint layout fair-esm can read ({type(e).__name__}: {e}); "
                         "if you trust the file, try allow_pickle=True") from e
    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    # not on the meta device: its tensor functions import PyTorch's compiler stack (a second of CPU per command);
    # uninitialised CPU storage is never touched (the checkpoint's tensors are assigned in its place)
    with skip_torch_init():
        model = ESM2(alphabet=alphabet, **sizes)
    return model, alphabet


def fair_esm2_state(data: Dict[str, Any], regression: Optional[Dict[str, Any]] = None) -> Dict[str, torch.Tensor]:
    """The checkpoint's state dict under ``ESM2``'s names (+ the regression file's tensors)."""
    state = {_FAIR_PREFIXES.sub("", k): v for k, v in data["model"].items()}
    if regression is not None:
        state.update({_FAIR_PREFIXES.sub("", k): v for k, v in regression["model"].items()})
    return state


def fill_missing_regression(model: torch.nn.Module, state: Dict[str, torch.Tensor]) -> None:
    """As fair-esm: without contact-regression weights, warn and keep a randomly initialised one."""
    if all(k in state for k in _REGRESSION):
        return
    warnings.warn("Regression weights not found, predicting contacts will not produce correct results.",
                  stacklevel=2)
    head = model.contact_head.regression
    head.to_empty(device="cpu")
    head.reset_parameters()
    state.update({f"contact_head.regression.{n}": p.detach() for n, p in head.named_parameters()})


def load_fair_esm2(data: Dict[str, Any], regression: Optional[Dict[str, Any]], path: Path):
    """(model in eval mode, alphabet): the checkpoint's tensors become the parameters, no copy."""
    model, alphabet = esm2_skeleton(data, path)
    state = fair_esm2_state(data, regression)
    fill_missing_regression(model, state)
    load_checked(model, state, where=str(path), assign=True)
    # fair-esm ties lm_head.weight to embed_tokens.weight; its copying loader leaves both equal to the
    # file's lm_head.weight (loaded last), so tie them to that tensor.
    model.embed_tokens.weight = model.lm_head.weight
    return model.eval(), alphabet


def save_fair_esm2(model: torch.nn.Module, path: Path, regression: str = "separate") -> Path:
    """Save an ``ESM2`` as fair-esm's hub files hold one (tests and demos: a checkpoint to load by path).

    ``path``: ``NAME.pt``, ``{"model": {"encoder.sentence_encoder.<k>" / "encoder.lm_head.<k>": tensor},
    "cfg": {"model": Namespace(encoder_layers, encoder_embed_dim, encoder_attention_heads, token_dropout)}}``;
    ``regression``: the contact head in ``NAME-contact-regression.pt`` beside it (``"separate"``, as published),
    in ``NAME.pt`` (``"inline"``) or nowhere (``"none"``).
    """
    import argparse

    state = model.state_dict()
    contact = {k: v for k, v in state.items() if k.startswith("contact_head.")}
    body = {("encoder." if k.startswith(("lm_head.", "contact_head.")) else "encoder.sentence_encoder.") + k: v
            for k, v in state.items() if regression == "inline" or not k.startswith("contact_head.")}
    cfg = argparse.Namespace(encoder_layers=model.num_layers, encoder_embed_dim=model.embed_dim,
                             encoder_attention_heads=model.attention_heads, token_dropout=model.token_dropout)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": body, "cfg": {"model": cfg}}, path)
    if regression == "separate":
        torch.save({"model": contact}, path.with_name(f"{path.stem}-contact-regression.pt"))
    return path
