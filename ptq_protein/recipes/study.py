"""The PTQ4Protein study's recipes, reproduced exactly (``study-*``).

What the study's published code (github.com/pengshuang/PTQ4Protein, package
``piecewise_quant``) did, bit for bit (``tests/quant/test_study_parity.py``):

* sites: the input of every ``nn.Linear`` / ``EsmFoldLinear`` / ``nn.LayerNorm`` /
  ``nn.Softmax`` module of the whole model, heads included (``quant_acts.py:81``);
  in ESMFold the only ``nn.Softmax`` module is the IPA softmax;
* range: their top-k statistic (whole tensor per call, BOS/EOS included, batch 1,
  first 50 calls, lower median of the k extremes, mean over calls); k=1 for
  uniform (the 0.685 row, ``quant_acts_exp1-1.ipynb#cell14``), k=2 for pwlq-3
  (``structure_prediction/scripts/quant_acts.py:61-62``);
* quantizers: their uniform (per tensor, codes [-128, 127] x 2M/255, unsigned
  [0, 255] x M/255 when the calibrated min >= 0) and their pwlq-3 (static M,
  breakpoint recomputed per call; 8-bit centre + 8-bit [-M, M] tail: 9 bits/value);
* W8: per row (>= 2-D) / per tensor (1-D) over the state-dict keys under
  ``esm.encoder.`` and ``trunk.block`` (biases, LayerNorm parameters and the
  range buffers included), after the activation quantizers are attached
  (``quant_exp_combine_v1.ipynb#cell10-11``). Structure module in FP.

Runtime as they ran it: calibration and inference use the model as loaded, one
sequence per forward: on CUDA the loader keeps ESMFold's ESM-2 stem in float16
(transformers' ``fp16_esm``; their quantizer then computes in float16 there, as
theirs did), and the chunk size and recycles are the model's own (our recipes
calibrate unchunked). ``--num-recycles`` still overrides both, as for any recipe.

Where we deliberately differ: the rotary ``inv_freq`` buffers are not rounded
(their W8 zeroed 12 of 32 frequencies; ``StudyOptions(round_rotary=True)`` does
it), a site called fewer than 50 times averages the calls it saw (theirs
averaged zero rows in; never the case in their runs), and all-zero rows are
left unchanged (theirs would become NaN; none existed). Their "full" scripts
evaluated float weights (a bug): ``study-w8a8-pwlq`` applies the W8 it names.

The per-part ablations (the study's notebook comments, scheme not recorded) use
pwlq-3 with k=2 here.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ptq_protein.config import (Granularity, QuantConfig, RangeMethod, Scheme, SiteKind, SpecialTokens, StudyOptions,
                                TensorQuant)

__all__ = ["PRESETS", "DOCS", "STUDY_KINDS"]

STUDY_KINDS = (SiteKind.LINEAR, SiteKind.LAYERNORM, SiteKind.SOFTMAX)
_UNIFORM_K, _PWLQ_K = 1, 2

_W8 = TensorQuant(bits=8, scheme=Scheme.STUDY_UNIFORM, granularity=Granularity.PER_CHANNEL)


def _acts(scheme: Scheme, k: int) -> TensorQuant:
    return TensorQuant(bits=8, scheme=scheme, range_method=RangeMethod.STUDY_TOPK, topk=k)


def _recipe(name: str, acts: Optional[TensorQuant], weights: Optional[TensorQuant] = None,
            kinds: Tuple[SiteKind, ...] = STUDY_KINDS, groups: Optional[Tuple[str, ...]] = None,
            include: Tuple[str, ...] = (), exclude: Tuple[str, ...] = ()) -> QuantConfig:
    return QuantConfig(weights=weights, activations=acts, kinds=kinds, groups=groups, include=include,
                       exclude=exclude, quantize_heads=True, study=StudyOptions(), name=name,
                       special_tokens=SpecialTokens.INCLUDE)  # the study quantized every computed row


_PWLQ = _acts(Scheme.STUDY_PWLQ, _PWLQ_K)

PRESETS: Dict[str, QuantConfig] = {
    "study-a8-uniform": _recipe("study-a8-uniform", _acts(Scheme.STUDY_UNIFORM, _UNIFORM_K)),
    "study-a8-pwlq": _recipe("study-a8-pwlq", _PWLQ),
    "study-w8a8-pwlq": _recipe("study-w8a8-pwlq", _PWLQ, _W8),
    "study-w8": _recipe("study-w8", None, _W8),
    "study-a8-pwlq-layernorm": _recipe("study-a8-pwlq-layernorm", _PWLQ, kinds=(SiteKind.LAYERNORM,)),
    "study-a8-pwlq-linear": _recipe("study-a8-pwlq-linear", _PWLQ, kinds=(SiteKind.LINEAR,)),
    "study-a8-pwlq-esm": _recipe("study-a8-pwlq-esm", _PWLQ, include=("esm.*",)),
    "study-a8-pwlq-trunk": _recipe("study-a8-pwlq-trunk", _PWLQ, exclude=("esm.*",)),
}

_SITES = "inputs of every Linear/LayerNorm/Softmax incl. heads"
_PW = "the study's pwlq-3 A8 (static range, per-call breakpoint, 9 bits/value), top-2"
DOCS: Dict[str, str] = {
    "study-a8-uniform": f"the study's uniform A8 (per tensor, codes [-128,127] x 2M/255), top-1 range, {_SITES}",
    "study-a8-pwlq": f"{_PW}, {_SITES}",
    "study-w8a8-pwlq": f"the study's W8 (per row, biases/LN/range buffers, esm.encoder + trunk.block) after {_PW}",
    "study-w8": "the study's W8 only: per row / per 1-D tensor over esm.encoder.* and trunk.block*, activations FP",
    "study-a8-pwlq-layernorm": f"ablation: {_PW} on LayerNorm inputs only",
    "study-a8-pwlq-linear": f"ablation: {_PW} on Linear inputs only",
    "study-a8-pwlq-esm": f"ablation: {_PW} on the ESM-2 stem's sites only (esm.*)",
    "study-a8-pwlq-trunk": f"ablation: {_PW} on every site outside the ESM-2 stem (trunk, structure module, heads)",
}
