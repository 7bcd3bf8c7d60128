"""The files that let transformers open an artifact: ``config.json`` and the source's tokenizer files.

``config.json`` is the source model's transformers config plus a
``quantization_config`` (``quant_method: "ptq_protein"``, the recipe, the
artifact format); for a fair-esm ESM-2 it is the ``EsmForMaskedLM`` config of
the same shapes (:func:`esm2_config`), written with the ESM alphabet's tokenizer
files, so transformers opens those too (:mod:`ptq_protein.artifact.fair_hf`).
``import ptq_protein`` registers that method with transformers
(:mod:`ptq_protein.interop.hf_hook`), so ``from_pretrained`` rebuilds the model
through :func:`ptq_protein.artifact.save_load.load` with its checks.

Without ptq-protein, transformers must not load the integer tensors as if they
were float weights (it would initialise every missing weight at random). The
config's ``transformers_weights`` (the weights file transformers reads) is
therefore a sentence saying what to install; transformers refuses it in its own
one-line ``ValueError``, and the registered quantizer points it at the real file.

The model is rebuilt only from the sealed ``recipe.json`` and tensors, so
``config.json`` cannot change outputs, except ``dtype``, which transformers casts
the model to: it is written as the sealed recipe's dtype and the quantizer refuses
another. Tokenizer files can (they map letters to ids), so their sha256 are part
of the sealed recipe (``tokenizer_files``). ``_name_or_path`` keeps a local
folder's last component only (the folder goes to the Hub with ``push_to_hub``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, Optional

from torch import nn

from ptq_protein.support.io_utils import public_source

__all__ = ["HF_CONFIG", "QUANT_METHOD", "INSTALL_HINT", "INSTALL_FROM_SOURCE", "SOURCE_REPO", "TOKENIZER_FILES",
           "NO_CLASS_MODEL_TYPE", "no_class_message", "hf_config", "esm2_config", "tokenizer_source",
           "copy_tokenizer_files", "write_esm_tokenizer"]

HF_CONFIG = "config.json"
QUANT_METHOD = "ptq_protein"
# ptq-protein is not on PyPI: it installs from a source checkout (the repository named in mkdocs.yml).
SOURCE_REPO = "https://github.com/ptq-protein/ptq-protein"
INSTALL_FROM_SOURCE = f"git clone {SOURCE_REPO} && pip install -e ./ptq-protein"
INSTALL_HINT = (f"this folder is a ptq-protein artifact: install ptq-protein from source ({INSTALL_FROM_SOURCE}), "
                "then import ptq_protein before from_pretrained")
# config.json model_type of an artifact whose model class is ptq-protein's own (ESM C): transformers has no class
# for it, so every from_pretrained refuses it in one line (hf_quantizer registers this type to say so).
NO_CLASS_MODEL_TYPE = "ptq_protein_no_transformers_class"
# What transformers' ESM tokenizers read or write (EsmTokenizer: vocab.txt and the two JSON files).
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json",
                   "added_tokens.json")


def no_class_message(cls: str) -> str:
    """The one line every ``from_pretrained`` of an artifact of ptq-protein's own ``cls`` (ESM C) gives."""
    return (f"this ptq-protein artifact holds ptq-protein's own {cls} class, which transformers does not have: "
            "from_pretrained does not apply; load it with ptq_protein.load(folder)")


def hf_config(qmodel: nn.Module, recipe_name: str, format_version: int,
              dtype: str = "float32") -> Optional[Dict[str, Any]]:
    """``config.json`` of a transformers model: its config plus ``quantization_config``; for a model class of
    ptq-protein's own (ESM C), one that makes ``from_pretrained`` refuse it (:func:`no_class_message`); None
    for other models (fair-esm's).

    ``dtype`` is the sealed recipe's (see :mod:`ptq_protein.models.float_dtypes`); the quantizer refuses a
    ``config.json`` whose ``dtype`` differs from it (an edit that would change outputs).
    """
    config = getattr(qmodel, "config", None)
    if type(qmodel).__name__ == "ESM2":  # fair-esm: transformers opens it as EsmForMaskedLM (artifact_fair_hf)
        out = esm2_config(_esm2_kwargs(qmodel), dtype)
    elif config is None or not hasattr(config, "to_dict") or not hasattr(qmodel, "save_pretrained"):
        from ptq_protein.models.architecture import describe_architecture

        if describe_architecture(qmodel)["library"] != "ptq-protein":
            return None
        # transformers_weights: read before any model is built, also where ptq-protein is not imported
        return {"model_type": NO_CLASS_MODEL_TYPE, "architectures": [type(qmodel).__name__],
                "transformers_weights": no_class_message(type(qmodel).__name__)}
    else:
        out = config.to_dict()
        out["architectures"], out["dtype"] = [type(qmodel).__name__], dtype
    out["_name_or_path"] = public_source(out.get("_name_or_path", ""))  # uploaded with push_to_hub: no local path
    out["quantization_config"] = {"quant_method": QUANT_METHOD, "recipe": recipe_name,
                                  "format_version": format_version}
    out["transformers_weights"] = INSTALL_HINT
    return json.loads(json.dumps(out, default=str))


def esm2_config(kwargs: Dict[str, Any], dtype: str = "float32") -> Dict[str, Any]:
    """The ``EsmForMaskedLM`` config (as a dict) of a fair-esm ``ESM2`` built with ``kwargs`` (its constructor's
    ``num_layers``, ``embed_dim``, ``attention_heads``, ``token_dropout``), as transformers' converter writes it."""
    from ptq_protein.models.tiny import hf_esm2_config

    config = hf_esm2_config(num_layers=kwargs["num_layers"], embed_dim=kwargs["embed_dim"],
                            heads=kwargs["attention_heads"], token_dropout=kwargs.get("token_dropout", True))
    out = config.to_dict()
    out["architectures"], out["dtype"] = ["EsmForMaskedLM"], dtype
    return json.loads(json.dumps(out, default=str))


def _esm2_kwargs(qmodel: nn.Module) -> Dict[str, Any]:
    return {"num_layers": qmodel.num_layers, "embed_dim": qmodel.embed_dim, "attention_heads": qmodel.attention_heads,
            "token_dropout": bool(qmodel.token_dropout)}


def write_esm_tokenizer(dest: Path) -> None:
    """The ESM-2 alphabet's transformers tokenizer files, for a fair-esm artifact (its source has none)."""
    from ptq_protein.models.tokens import esm_tokenizer

    esm_tokenizer().save_pretrained(str(dest))


def tokenizer_source(qmodel: nn.Module, model_info: Optional[Dict[str, Any]]) -> Optional[Path]:
    """The local folder the model was read from (the CLI's source, or transformers' ``name_or_path``), if any."""
    candidates = [(model_info or {}).get("source"), getattr(getattr(qmodel, "config", None), "name_or_path", None)]
    for candidate in candidates:
        if isinstance(candidate, str) and candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def copy_tokenizer_files(source: Optional[Path], dest: Path) -> Dict[str, str]:
    """Copy the tokenizer files ``source`` has into ``dest``; returns ``{name: sha256}`` of those copied."""
    from ptq_protein.artifact.seal import file_sha256

    copied: Dict[str, str] = {}
    if source is None:
        return copied
    for name in TOKENIZER_FILES:
        path = source / name
        if path.is_file():  # a hub cache links its files: copy the content
            shutil.copyfile(path, dest / name)
            copied[name] = file_sha256(dest / name)
    return copied
