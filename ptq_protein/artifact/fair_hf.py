"""A fair-esm ESM-2 artifact opened by transformers: the same quantized modules under ``EsmForMaskedLM``'s names.

fair-esm's ``ESM2`` and transformers' ``EsmForMaskedLM`` hold the same weights under other names
(:mod:`ptq_protein.models.esm_keymap`). :func:`ptq_protein.artifact.save_load.save` gives an artifact quantized from a
fair-esm ESM-2 a ``config.json`` (the ``EsmForMaskedLM`` config of its shapes,
:func:`ptq_protein.artifact.hf_files.hf_config`) and the ESM alphabet's tokenizer files, so ``from_pretrained``,
``EsmModel.from_pretrained`` and ``pipeline(..., ARTIFACT)`` open it: the registered quantizer builds the model
with :func:`load_as_transformers`, which renames the verified recipe and tensors module by module and rebuilds
them through the code ``pp.load`` uses (:func:`ptq_protein.artifact.save_load.build_from_recipe`). ``pp.load`` of such
an artifact still returns the fair-esm model, unchanged.

What is equal and what is not. Every tensor is the artifact's, bit for bit, under its transformers name
(weight codes, scales, activation quantizers, float weights), and each quantized module computes what it
computes in ``pp.load``'s model on the same input. The code between them is transformers' ESM instead of
fair-esm's (attention, rotary embedding), whose float32 results differ in the last bits. So a weight-only
recipe's outputs differ from ``pp.load``'s by float32 rounding alone; with quantized activations, a value
that this rounding moves across a rounding boundary of its code moves by one quantization step (tested
bound: tests/interop/test_fair_artifact_hf.py).

The tokenizer files are not sealed (the fair-esm alphabet is fixed, and sealing them would change every
fair-esm artifact's recipe): :func:`load_as_transformers` checks instead that they encode every letter as
the fair-esm alphabet does. Refused, in one line: a recipe that quantizes attention products (MATMUL sites:
they are numbered in fair-esm's attention code, which transformers computes otherwise), and fair-esm
models other than ESM-2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import nn

from ptq_protein.artifact.save_load import RECIPE, build_from_recipe, read_verified
from ptq_protein.models.esm_keymap import fair_esm2_to_hf, fair_name_to_hf
from ptq_protein.models.float_dtypes import main_dtype
from ptq_protein.support.errors import ArtifactError

__all__ = ["load_as_transformers", "fair_recipe_as_hf", "TRANSFORMERS_FAMILY"]

TRANSFORMERS_FAMILY = "hf-esm"  # the adapter family of EsmForMaskedLM
_PROBE = "LAGVSERTIDPKQNFYMHWCXBUZO"  # every letter the ESM alphabet has a token for


def load_as_transformers(path: Union[str, Path], device: str = "cpu", backend: Optional[str] = None) -> nn.Module:
    """The artifact as a transformers model: ``pp.load``'s model, or for a fair-esm ESM-2 artifact the same
    quantized modules in an ``EsmForMaskedLM`` (see the module docstring); ``backend`` as ``pp.load`` takes it."""
    from ptq_protein.nn.int_exec import parse_engine, set_engine

    path = Path(path)
    recipe, tensors = read_verified(path)
    if recipe["architecture"].get("library") == "fair-esm":
        _check_tokenizer(path)
        recipe, tensors = fair_recipe_as_hf(recipe, tensors, path / RECIPE)
    model = build_from_recipe(recipe, tensors, path, device=device, backend=backend)
    return set_engine(model.eval().to(device), parse_engine("auto"))


def fair_recipe_as_hf(recipe: Dict[str, Any], tensors: Dict[str, torch.Tensor], where: Path
                      ) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
    """A verified fair-esm ESM-2 recipe and its tensors under transformers' names (what an artifact of the
    same quantized model saved from ``EsmForMaskedLM`` would hold)."""
    from ptq_protein.artifact.hf_files import esm2_config

    arch = recipe["architecture"]
    if arch.get("class") != "ESM2":
        raise ArtifactError(f"{where}: transformers has no model for fair-esm {arch.get('class')} artifacts "
                            "(only ESM-2 maps to EsmForMaskedLM): load it with ptq_protein.load")
    matmul = [name for name, entry in recipe["sites"].items() if entry["kind"] == "matmul"]
    if matmul:
        raise ArtifactError(f"{where}: recipe {recipe['config'].get('name')!r} quantizes the attention products "
                            f"({matmul[0]}, ...) as fair-esm's attention computes them, which transformers' ESM "
                            "attention does not: load it with ptq_protein.load, or quantize the transformers "
                            "checkpoint")
    parts = set(recipe.get("dtypes") or {}) - {""}
    if parts:
        raise ArtifactError(f"{where}: parts of this model run in their own dtype ({sorted(parts)}), which has no "
                            "transformers counterpart here: load it with ptq_protein.load")
    name = _renamer(where)
    out = dict(recipe)
    out["architecture"] = {"library": "transformers", "class": "EsmForMaskedLM",
                           "config": esm2_config(arch["kwargs"], main_dtype(recipe.get("dtypes")))}
    out["family"] = TRANSFORMERS_FAMILY
    out["sites"] = {name(k): v for k, v in recipe["sites"].items()}
    out["site_list"] = [{**s, "name": name(s["name"])} for s in recipe["site_list"]]
    out["fp_sites"] = [name(n) for n in recipe.get("fp_sites", [])]
    out["aliases"] = {name(k): name(v) for k, v in recipe.get("aliases", {}).items()}
    if recipe.get("mixed_precision") is not None:
        plan = dict(recipe["mixed_precision"])
        plan["units"] = [[fair_name_to_hf(u[0]) or u[0], *u[1:]] for u in plan.get("units", [])]
        out["mixed_precision"] = plan
    rotary = {k: v for k, v in tensors.items() if fair_name_to_hf(k) is None}
    renamed = {name(k): v for k, v in tensors.items() if k not in rotary}
    renamed.update(_rotary(rotary, out["architecture"], where))
    return out, renamed


def _renamer(where: Path):
    def name(fair: str) -> str:
        hf = fair_name_to_hf(fair)
        if hf is None:
            raise ArtifactError(f"{where}: {fair!r} has no transformers name (a fair-esm ESM-2 artifact holds none "
                                "such): the artifact is corrupt or from another release; load it with "
                                "ptq_protein.load")
        return hf

    return name


def _rotary(tables: Dict[str, torch.Tensor], architecture: Dict[str, Any], where: Path) -> Dict[str, torch.Tensor]:
    """The rotary frequency tables under the names this transformers version keeps (one shared, or per layer)."""
    from ptq_protein.models.architecture import build_architecture
    from ptq_protein.models.esm_keymap import uses_per_layer_rotary

    with torch.device("meta"):
        skeleton = build_architecture(architecture, initialise=False)
    try:
        mapped = fair_esm2_to_hf(tables, rotary_per_layer=uses_per_layer_rotary(skeleton))
    except ValueError as err:  # layers' tables differ
        raise ArtifactError(f"{where}: {err}; the artifact is corrupt: re-run quantize") from err
    if mapped.unknown:
        raise ArtifactError(f"{where}: {mapped.unknown[0]!r} has no transformers name: the artifact is corrupt or "
                            "from another release; load it with ptq_protein.load")
    return mapped.state_dict


def _check_tokenizer(path: Path) -> None:
    """The folder's tokenizer (if it has one) must encode every letter as fair-esm's ESM-2 alphabet does."""
    from ptq_protein.artifact.hf_files import TOKENIZER_FILES
    from ptq_protein.models.tokens import esm_vocab

    if not any((path / name).exists() for name in TOKENIZER_FILES):
        return
    from transformers import AutoTokenizer

    try:
        got = AutoTokenizer.from_pretrained(str(path))(_PROBE)["input_ids"]
    except (OSError, ValueError) as err:
        raise ArtifactError(f"{path}: its tokenizer files cannot be read ({err}); they were edited: restore them "
                            "(re-run quantize) or load with ptq_protein.load") from err
    vocab = esm_vocab()
    want = [vocab.index("<cls>"), *(vocab.index(a) for a in _PROBE), vocab.index("<eos>")]
    if got != want:
        raise ArtifactError(f"{path}: its tokenizer files encode letters otherwise than the ESM-2 alphabet the "
                            "model was quantized with (they were edited): restore them (re-run quantize) or load "
                            "with ptq_protein.load")
