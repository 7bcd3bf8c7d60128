"""Named recipes users pick with ``--preset`` / ``pp.quantize(model, "w8a8-pwlq")``.

The recipes live in :mod:`ptq_protein.recipes`, one file per family: ours
(:mod:`~ptq_protein.recipes.ours`), the field's baselines (:mod:`~ptq_protein.recipes.baselines`:
SmoothQuant, GPTQ, FP8) and the PTQ4Protein study's own method,
reproduced bit for bit (:mod:`~ptq_protein.recipes.study`, the ``study-*``
names). This module merges them into one registry. Our presets keep embeddings,
the LM head, contact regression and the distogram / pLDDT / pTM heads in
floating point (``quantize_heads=False``); the study's quantize the heads' inputs
too, as the study did. Ours and the baselines keep the language model's BOS/EOS
rows in floating point (``special_tokens="float"``); the study's include them.
"""

from __future__ import annotations

from typing import Dict, Union

from ptq_protein.recipes import baselines, ours, study
from ptq_protein.recipes.config import QuantConfig

__all__ = ["PRESETS", "PRESET_DOCS", "get_preset", "resolve_config", "preset_for_bits"]

_FAMILIES = (ours, baselines, study)

PRESETS: Dict[str, QuantConfig] = {}
PRESET_DOCS: Dict[str, str] = {}
for _family in _FAMILIES:
    assert not set(_family.PRESETS) & set(PRESETS), f"{_family.__name__} redefines a preset"
    assert set(_family.PRESETS) == set(_family.DOCS), f"{_family.__name__}: every preset needs one doc line"
    PRESETS.update(_family.PRESETS)
    PRESET_DOCS.update(_family.DOCS)


def get_preset(name: str) -> QuantConfig:
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        import difflib

        close = difflib.get_close_matches(str(name), list(PRESETS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown preset {name!r}; {hint}choose one of: {', '.join(PRESETS)} "
                         "(or build a pp.QuantConfig)") from None


def preset_for_bits(bits: int) -> str:
    """The default recipe for ``--bits N``: piecewise-linear activations at N bits, N-bit weights."""
    if bits == 8:
        return "w8a8-pwlq"
    if bits == 6:
        return "w6a6-pwlq"
    if bits == 4:
        return "w4a8-pwlq"
    raise ValueError(f"--bits {bits} has no preset (choose 4, 6 or 8, or pass --preset / a QuantConfig)")


def resolve_config(config: Union[str, QuantConfig, dict]) -> QuantConfig:
    """Accept a preset name, a config or a ``to_dict`` dict."""
    if isinstance(config, QuantConfig):
        return config
    if isinstance(config, str):
        return get_preset(config)
    if isinstance(config, dict):
        return QuantConfig.from_dict(config)
    raise TypeError(f"config must be a preset name, a QuantConfig or a dict, got {type(config).__name__}")
