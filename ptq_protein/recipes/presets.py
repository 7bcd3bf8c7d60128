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

from dataclasses import dataclass
from typing import Dict, List, Optional, Union

from ptq_protein.recipes import baselines, ours, study
from ptq_protein.recipes.config import Granularity, QuantConfig, Scheme

__all__ = ["PRESETS", "PRESET_DOCS", "PRESET_GROUPS", "PresetLine", "preset_lines", "lm_point", "get_preset",
           "LM_DEFAULT", "LM_FAMILIES", "resolve_config", "preset_for_bits"]

_FAMILIES = (ours, baselines, study)

PRESETS: Dict[str, QuantConfig] = {}
PRESET_DOCS: Dict[str, str] = {}
PRESET_GROUPS: Dict[str, str] = {}  # name -> the family file it comes from: "ours", "baselines" or "study"
for _family in _FAMILIES:
    assert not set(_family.PRESETS) & set(PRESETS), f"{_family.__name__} redefines a preset"
    assert set(_family.PRESETS) == set(_family.DOCS), f"{_family.__name__}: every preset needs one doc line"
    PRESETS.update(_family.PRESETS)
    PRESET_DOCS.update(_family.DOCS)
    PRESET_GROUPS.update(dict.fromkeys(_family.PRESETS, _family.__name__.rsplit(".", 1)[-1]))


@dataclass(frozen=True)
class PresetLine:
    """One preset as ``ptq-protein presets`` lists it."""

    name: str
    group: str  # "ours", "baselines" or "study"
    doc: str
    esmc_only: bool  # the recipe rotates ESM C's SwiGLU product, which only ESM C has
    esmfold_only: bool  # the recipe runs ESMFold's trunk in its own dtype (trunk_dtype), which only ESMFold has
    lm_point: str  # "fast", "accurate" or "" (see lm_point)


def preset_lines() -> List[PresetLine]:
    """Every registered preset, in registry order (ours, the baselines, the study's)."""
    return [PresetLine(name, PRESET_GROUPS[name], PRESET_DOCS[name], bool(cfg.rotate_ffn), cfg.trunk_dtype is not None,
                       "" if cfg.trunk_dtype is not None else lm_point(cfg))
            for name, cfg in PRESETS.items()]


def lm_point(cfg: QuantConfig) -> str:
    """Where ``cfg`` sits for a language model's CPU embeddings, read from what it computes (not a measurement).

    ``"fast"``: uniform 8-bit activations, per tensor (static) or per token (dynamic), with integer weights of at
    most 8 bits: every quantized Linear is one integer GEMM (a static per-tensor recipe runs ESM-2's fused integer
    layer; a per-token one needs no calibration). ``"accurate"``: the same, with the sites where outliers cost most
    kept in floating point (``exclude``): their float products trade a little speed for accuracy. ``""``: neither:
    piecewise-linear activations (several integer GEMMs per site, about float speed on a CPU), weights only, FP8,
    other widths, the study's reproductions.
    """
    weights = cfg.weights
    if cfg.activations is None or weights is None or cfg.study is not None:
        return ""
    every = (cfg.activations, *(spec for _, spec in cfg.activations_at))
    one_gemm = all(a.bits == 8 and a.scheme is Scheme.UNIFORM
                   and a.granularity in (Granularity.PER_TENSOR, Granularity.PER_TOKEN) for a in every)
    if one_gemm and weights.scheme is Scheme.UNIFORM and weights.bits <= 8:
        return "accurate" if cfg.exclude else "fast"
    return ""


def get_preset(name: str) -> QuantConfig:
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        import difflib

        close = difflib.get_close_matches(str(name), list(PRESETS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown preset {name!r}; {hint}choose one of: {', '.join(PRESETS)} "
                         "(or build a pp.QuantConfig)") from None


#: ``--bits 8`` on an ESM-2 language model (fair-esm or transformers): the accurate point of its CPU embeddings.
LM_DEFAULT = "w8a8-smoothquant-gptq-lntoken"
#: The model families that are ESM-2 language models (their fused integer layer embeds).
LM_FAMILIES = ("fair-esm", "hf-esm")


def preset_for_bits(bits: int, family: Optional[str] = None) -> str:
    """The default recipe for ``--bits N``: piecewise-linear activations at N bits, N-bit weights, except at 8 bits
    on the families whose 8-bit default differs.

    ``family`` is the model adapter's (:attr:`~ptq_protein.models.adapter_base.ModelAdapter.family`): ESMFold's
    8-bit default runs its folding trunk in bfloat16 and keeps the rest in float (``bf16-trunk``, see
    :mod:`ptq_protein.recipes.ours` for why); an ESM-2 language model's is :data:`LM_DEFAULT`, whose int8 layers
    embed as accurately as OpenVINO's bfloat16 at its CPU time (BENCHMARKS.md), where ``w8a8-pwlq`` runs at about
    float speed; other models (ESM C, unknown) take ``w8a8-pwlq``.
    """
    if bits == 8:
        if family == "hf-esmfold":
            return "bf16-trunk"
        return LM_DEFAULT if family in LM_FAMILIES else "w8a8-pwlq"
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
