"""The artifact's ``README.md``: a Hub model card saying what the artifact is and how to load it.

Written by :func:`ptq_protein.artifact.save_load.save` from the recipe alone; the CLI adds
the fidelity table it measured (:func:`write_model_card`). The card is outside
the seal on purpose: Hub users edit cards, and no output depends on it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional

from ptq_protein.artifact.hf_files import INSTALL_FROM_SOURCE

__all__ = ["CARD", "model_card", "write_model_card"]

CARD = "README.md"
_NO_FIDELITY = ("Not measured when this artifact was written (the Python API, or `quantize --check 0`). "
                "Run `ptq-protein eval` against the float model to measure it.")


def model_card(recipe: Dict[str, Any], fidelity_markdown: Optional[str] = None) -> str:
    """The card's text for a recipe (the dict :func:`ptq_protein.artifact.save_load.save` writes as ``recipe.json``)."""
    model, config = recipe.get("model") or {}, recipe["config"]
    name = model.get("name") or recipe["architecture"].get("class", "model")
    hf = recipe["architecture"].get("library") == "transformers"
    lines = ["---", f"library_name: {'transformers' if hf else 'ptq-protein'}", "tags:"]
    lines += [f"  - {tag}" for tag in ("ptq-protein", "quantized", "protein-language-model", recipe["family"])]
    base = _base_model(name)
    lines += [f"base_model: {base}", "base_model_relation: quantized"] if base else []
    lines += ["---", "", f"# {name}, quantized with ptq-protein ({config['name']})", ""]
    lines += _source(model) + [""] + _recipe_words(recipe) + [""] + _calibration(recipe.get("calibration"))
    lines += ["", "## Fidelity against the float model", "", fidelity_markdown or _NO_FIDELITY, ""]
    lines += _how_to_load(recipe, hf) + ["", "## Toolkit", ""]
    lines += [f"- {k}: {v}" for k, v in sorted(recipe.get("versions", {}).items())]
    lines += [f"- artifact format {recipe['format_version']}; `pp.load` verifies every tensor against the sealed "
              "recipe (this card is not sealed)", ""]
    return "\n".join(lines)


def write_model_card(folder: Path, fidelity_markdown: Optional[str]) -> None:
    """Rewrite ``folder``'s card with a fidelity table (the CLI measures it after saving)."""
    import json

    from ptq_protein.support.io_utils import atomic_write_text

    recipe = json.loads((Path(folder) / "recipe.json").read_text())
    atomic_write_text(Path(folder) / CARD, model_card(recipe, fidelity_markdown))


def _base_model(name: str) -> Optional[str]:
    """A Hub id for ``base_model``, only where the source is one: a published ESM release (its facebook/
    repository) or an ``org/name`` id that is no local path. A file's own name is nobody's release
    (``esm2_tiny.pt`` is not ``facebook/esm2_tiny``)."""
    from ptq_protein.models.resolve import ESMC_MODELS, ESMFOLD_HF_REPO, ESMFOLD_NAMES, FAIR_ESM_MODELS

    short = name.split("/", 1)[1] if name.startswith("facebook/") else name
    if short in FAIR_ESM_MODELS:
        return f"facebook/{short}"
    if short in ESMFOLD_NAMES:
        return ESMFOLD_HF_REPO
    if name in ESMC_MODELS:  # EvolutionaryScale's repository of the file
        return ESMC_MODELS[name][1]
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name) and not name.startswith(".") and not Path(name).exists():
        return name
    return None


def _source(model: Dict[str, Any]) -> List[str]:
    sha = model.get("source_sha256")
    return ["## Source model", "", f"- name: {model.get('name', 'unknown')}",
            f"- read from: {model.get('source', 'unknown')}",
            f"- sha256 of its weights: {sha or 'not recorded'}"]


def _recipe_words(recipe: Dict[str, Any]) -> List[str]:
    sites = recipe["sites"]
    kinds: Dict[str, int] = {}
    for entry in sites.values():
        kinds[entry["kind"]] = kinds.get(entry["kind"], 0) + 1
    weight_bits = sorted({e["weight_spec"]["bits"] for e in sites.values() if e.get("weight_spec")})
    act_bits = sorted({e["input_quant"]["spec"]["bits"] for e in sites.values() if "input_quant" in e})
    config = recipe["config"]
    return ["## Recipe", "", f"- {_describe(config)}",
            f"- bits per value: weights {'/'.join(map(str, weight_bits)) or 'float'}, activations "
            f"{'/'.join(map(str, act_bits)) or 'float'} (integer codes with float32 scales)",
            f"- quantized sites: {len(sites)} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})",
            "- kept in floating point: everything that is not a quantized site (embeddings, output heads, attention "
            f"scores and softmax, residual adds){_excluded(recipe)}",
            *_backend_words(config)]


def _backend_words(config: Dict[str, Any]) -> List[str]:
    """The backend recorded (``recipe.json``'s ``config.backend``) and what a load with none named runs where."""
    from ptq_protein.nn.backend_choice import where_it_runs
    from ptq_protein.recipes.config import QuantConfig

    recorded = f"- backend recorded: {config.get('backend', 'fake')} (recipe.json's `config.backend`)"
    try:
        where = where_it_runs(QuantConfig.from_dict(config))
    except (ValueError, TypeError, KeyError):  # a card must never stop a save
        return [recorded]
    return [f"{recorded}; `pp.load`, `embed`, `score` and `fold` with no backend named run:"] + [
        f"  - {line}" for line in where]


def _excluded(recipe: Dict[str, Any]) -> str:
    count = len(recipe.get("fp_sites") or [])
    return f"; {count} further sites kept in float by the recipe or plan" if count else ""


def _describe(config: Dict[str, Any]) -> str:
    from ptq_protein.recipes.config import QuantConfig

    try:
        return QuantConfig.from_dict(config).describe()
    except (ValueError, TypeError, KeyError):  # a card must never stop a save
        return str(config.get("name"))


def _calibration(calib: Optional[Dict[str, Any]]) -> List[str]:
    if not calib:
        return ["## Calibration", "", "None (weight-only or dynamic recipe)."]
    return ["## Calibration", "", f"- set: {calib.get('name')}, {calib.get('num_sequences')} sequences",
            f"- sha256 of the sequences: {calib.get('sha256')}"]


def _how_to_load(recipe: Dict[str, Any], hf: bool) -> List[str]:
    cls = recipe["architecture"].get("class", "AutoModel")
    lines = ["## How to load", "", "With ptq-protein, installed from source (it is not on PyPI):", "", "```bash",
             INSTALL_FROM_SOURCE, "```", "", "```python",
             "import ptq_protein as pp", "model = pp.load(\"path/to/this/folder\")  # verifies the seal", "```"]
    if hf:
        lines += ["", "With transformers (ptq-protein installed; importing it registers the method):", "",
                  "```python", "import ptq_protein  # noqa: F401", f"from transformers import {cls}",
                  f"model = {cls}.from_pretrained(\"path/to/this/folder\")", "```"]
    lines += ["", "With ONNX Runtime (the `onnx` extra: `pip install -e './ptq-protein[onnx]'`; recipes whose sites "
              "are uniform 8-bit, others "
              "are refused naming the site; ESMFold: its ESM-2 stem):", "", "```bash",
              "ptq-protein export path/to/this/folder --format onnx --out model.onnx", "```"]
    return lines
