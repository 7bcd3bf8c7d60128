"""Describe a model's architecture as JSON and rebuild an empty one from it (for artifacts).

Only constructor arguments are recorded, never pickled objects, so an artifact
can be reloaded without unpickling anything.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any, ContextManager, Dict

from torch import nn

from ptq_protein.models.no_init import skip_torch_init
from ptq_protein.support.errors import ArtifactError
from ptq_protein.support.io_utils import public_source

__all__ = ["describe_architecture", "build_architecture", "TRANSFORMERS_CLASSES"]

# The transformers model classes an artifact may name: only these are ever built from a recipe, so a
# forged class name cannot make the loader call another transformers callable.
TRANSFORMERS_CLASSES = ("EsmModel", "EsmForMaskedLM", "EsmForProteinFolding", "EsmForTokenClassification",
                        "EsmForSequenceClassification")


_ESMC_ARGS = {"d_model", "n_heads", "n_layers"}


def describe_architecture(model: nn.Module) -> Dict[str, Any]:
    name = type(model).__name__
    if name == "ESM2":
        return {"library": "fair-esm", "class": "ESM2",
                "kwargs": {"num_layers": model.num_layers, "embed_dim": model.embed_dim,
                           "attention_heads": model.attention_heads, "token_dropout": bool(model.token_dropout)}}
    if name == "ProteinBertModel":
        return {"library": "fair-esm", "class": "ProteinBertModel", "args": dict(vars(model.args))}
    if type(model).__module__ == "ptq_protein.models.esmc":
        kwargs = {"d_model": model.d_model, "n_heads": model.n_heads, "n_layers": model.num_layers}
        if model.ffn_rotation:  # written only when set: the description of an unrotated model is unchanged
            kwargs["ffn_rotation"] = model.ffn_rotation
        return {"library": "ptq-protein", "class": name, "kwargs": kwargs}
    if hasattr(model, "config") and hasattr(model.config, "to_dict"):
        config = model.config.to_dict()
        config["_name_or_path"] = public_source(config.get("_name_or_path", ""))  # never a private local path
        desc = {"library": "transformers", "class": name, "config": config}
        if name == "EsmModel" and getattr(model, "pooler", None) is None:  # e.g. EsmForMaskedLM's own .esm
            desc["kwargs"] = {"add_pooling_layer": False}
        return desc
    raise TypeError(f"cannot describe the architecture of {name} for an artifact")


def build_architecture(desc: Dict[str, Any], initialise: bool = True) -> nn.Module:
    """A model of the described architecture (weights are loaded after).

    ``initialise=False`` skips the random initialisation of its parameters (transformers' ``no_init_weights``,
    which covers ``torch.nn.init`` too): the caller overwrites every one (``pp.load`` refuses an artifact that
    leaves any missing), and the pages of a float weight never written are never resident. An ESM-2 650M
    artifact loaded with ``backend="int8"`` peaked at 3.4 GiB before, from the float weights it replaces.
    """
    skip = _no_init_weights if desc.get("library") == "transformers" else skip_torch_init  # no transformers import
    with contextlib.nullcontext() if initialise else skip():
        return _build(desc)


def _no_init_weights() -> ContextManager:
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers < 5 keeps it in modeling_utils
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def _build(desc: Dict[str, Any]) -> nn.Module:
    try:
        library, cls = desc["library"], desc["class"]
    except (KeyError, TypeError) as err:
        raise ArtifactError("recipe.json has no valid 'architecture' entry; the artifact is corrupt: "
                            "re-run quantize") from err
    if library == "fair-esm":
        import esm

        alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
        if cls == "ESM2":
            return esm.model.esm2.ESM2(alphabet=alphabet, **desc["kwargs"])
        if cls == "ProteinBertModel":
            return esm.model.esm1.ProteinBertModel(argparse.Namespace(**desc["args"]), alphabet)
    if library == "ptq-protein" and cls == "ESMC":
        from ptq_protein.models.esmc import ESMC

        kwargs = desc.get("kwargs")
        if not isinstance(kwargs, dict) or not _ESMC_ARGS <= set(kwargs) <= _ESMC_ARGS | {"ffn_rotation"}:
            raise ArtifactError(f"recipe.json gives ESMC the arguments {kwargs!r}, not d_model, n_heads and n_layers "
                                "(and ffn_rotation): the artifact is corrupt, re-run quantize")
        try:
            return ESMC(**kwargs)
        except (TypeError, ValueError) as err:
            raise ArtifactError(f"recipe.json's ESMC arguments {kwargs!r} build no model ({err}): the artifact is "
                                "corrupt, re-run quantize") from err
    if library == "transformers":
        if cls not in TRANSFORMERS_CLASSES:
            raise ArtifactError(f"recipe.json names the transformers class {cls!r}, which ptq-protein does not build "
                                f"(it builds {', '.join(TRANSFORMERS_CLASSES)}); the artifact is corrupt: "
                                "re-run quantize")
        import transformers

        config = transformers.EsmConfig.from_dict(dict(desc["config"]))
        model_cls = getattr(transformers, cls, None)
        if model_cls is None:
            raise ArtifactError(f"transformers has no class {cls}; install a transformers version that has it")
        kwargs = desc.get("kwargs") or {}
        if set(kwargs) - {"add_pooling_layer"}:
            raise ArtifactError(f"recipe.json gives {cls} the arguments {sorted(kwargs)}; ptq-protein passes only "
                                "add_pooling_layer: the artifact is corrupt, re-run quantize")
        return model_cls(config, **kwargs)
    raise ArtifactError(f"unknown architecture {library}/{cls} in recipe.json")
