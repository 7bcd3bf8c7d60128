"""A Hugging Face model folder read as the loader needs it: the model class its config names, its tokenizer,
the digest of the files it reads, and whether a folder with a recipe.json is an artifact transformers does not open."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Tuple

from ptq_protein.models.checkpoints import file_sha256
from ptq_protein.models.tokens import esm_tokenizer, esmfold_tokenizer
from ptq_protein.support.digests import listing_sha256
from ptq_protein.support.errors import InputError

__all__ = ["read_hf_folder", "own_loader_artifact", "folder_sha256"]

logger = logging.getLogger(__name__)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json")
# besides the weights, what a load reads (the folder's digest covers them)
_READ_FILES = ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def read_hf_folder(folder: Path) -> Tuple[Any, Any, bool]:
    """EsmForProteinFolding (config.is_folding_model), EsmModel (a trunk saved without a head, as its
    config.json's ``architectures`` says) or EsmForMaskedLM; all keys required. Returns (model, tokenizer,
    whether it folds)."""
    from transformers import EsmConfig, EsmForMaskedLM, EsmForProteinFolding, EsmModel, EsmTokenizer

    try:
        config = EsmConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, TypeError) as e:
        raise InputError(f"{folder}/config.json is not an ESM config ({e}); point at an ESM-2 or ESMFold folder") from e
    folding = bool(config.is_folding_model)
    trunk = not folding and list(config.architectures or ()) == ["EsmModel"]
    model_class = EsmForProteinFolding if folding else EsmModel if trunk else EsmForMaskedLM
    try:
        extra = {"add_pooling_layer": _has_pooler(folder)} if trunk else {}
        model, info = model_class.from_pretrained(folder, config=config, local_files_only=True,
                                                  output_loading_info=True, **extra)
    except Exception as e:  # noqa: BLE001 -- safetensors/torch raise many types for a bad file
        detail = " ".join(str(e).split())
        if "size mismatch" in detail or "shape" in detail:
            raise InputError(f"{folder}: the weights' shapes do not match its config.json ({detail[:200]}); "
                             "use the config the weights were saved with") from e
        raise InputError(f"{folder}: weights could not be read ({type(e).__name__}: {detail[:200]}); "
                         "the files may be truncated: re-download them") from e
    problems = {k: list(v) for k, v in info.items() if k in ("missing_keys", "mismatched_keys") and v}
    if problems:
        raise InputError(f"{folder}: weights do not fit {model_class.__name__}: "
                         + "; ".join(f"{k} ({len(v)}): {v[:8]}" for k, v in problems.items()))
    if info.get("unexpected_keys"):
        logger.warning("%s: ignored %d unexpected keys (e.g. %s)", folder, len(info["unexpected_keys"]),
                       list(info["unexpected_keys"])[:3])
    if (folder / "vocab.txt").is_file():
        tokenizer = EsmTokenizer.from_pretrained(folder, local_files_only=True)
    else:
        tokenizer = esmfold_tokenizer() if folding else esm_tokenizer(config.vocab_list or ())
    return model.eval(), tokenizer, folding


def own_loader_artifact(folder: Path) -> bool:
    """An artifact of a fair-esm model or of ptq-protein's own class (ESM C), as its recipe.json describes it."""
    try:
        library = json.loads((folder / "recipe.json").read_text())["architecture"]["library"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False
    return library in ("fair-esm", "ptq-protein")


def _has_pooler(folder: Path) -> bool:
    """Whether an ``EsmModel`` folder holds pooler weights (``EsmForMaskedLM.esm`` is saved without them)."""
    from safetensors import safe_open

    path = folder / "model.safetensors"
    if not path.is_file():
        return True  # a .bin: transformers' default, and its own missing-key message otherwise
    with safe_open(str(path), framework="pt") as f:
        return any(key.startswith("pooler.") for key in f.keys())


def folder_sha256(folder: Path) -> str:
    """sha256 of "name sha256" lines for every file the load reads: config.json, the weights, the tokenizer's."""
    names = sorted(p.name for p in folder.iterdir()
                   if p.is_file() and (p.name in _READ_FILES or p.name.startswith(("model", "pytorch_model")))
                   and p.name.endswith(_WEIGHT_SUFFIXES + (".txt",)))
    return listing_sha256([(n, file_sha256(folder / n)) for n in names])
