"""The PTQ4Protein study's recipes, reproduced exactly to its published package (``study-*``).

"Study-exact" means exact to the code the study published: the ``piecewise_quant``
package (github.com/pengshuang/PTQ4Protein, commit 605deb2), bit for bit
(``tests/quant/test_study_parity.py``). It does not tie these recipes to the
printed numbers: every structure and contact notebook that printed a number
imports ``linear_quant``, a module the study did not publish. Only
``quant_exp_combine_v2`` imports ``piecewise_quant``, and that run evaluated a
freshly loaded model, float weights. What the notebooks show of ``linear_quant``
is its interface (the same ``quant_model_acts`` / ``load_model_act_stats`` /
``quant_checkpoint`` calls) and one match: its W8 RMSE (``quant_weis_exp2#cell7``,
9.4016e-04) equals ``piecewise_quant``'s on the same keys (``combine_v2#cell2``).

Where each published structure number came from, as far as the code shows:

======================  =========  ================================================  ==================================
row (mean TM, CAMEO)    value      source (module; settings the cell records)        recipe here
======================  =========  ================================================  ==================================
FP32                    0.80085    ``quant_acts_exp1-1#cell15`` comment              ``fp``
uniform A8              0.6850496  ``#cell14`` comment (linear_quant; top-1, 50      ``study-a8-uniform``
                                   calls; scheme not named)
PWLQ A8                 0.7996540  ``#cell13`` output (linear_quant; pwlq-3, top-2)  ``study-a8-pwlq``
W8 + PWLQ A8            0.7983532  ``combine_v1#cell15`` (linear_quant; A8 first,    ``study-w8a8-pwlq``
                                   then W8 on ``esm.encoder.``/``trunk.block``)
W8                      0.8010496  ``quant_weis_exp2#cell10`` (linear_quant; stem    ``study-w8-notebook``
                                   cast to float32; ``esm.encoder.``/``trunk.block``)
per-part ablations      0.7313...  ``#cell15`` comments; configuration not recorded  none (see below)
======================  =========  ================================================  ==================================

What the published package does (and these recipes do):

* sites: the input of every ``nn.Linear`` / ``EsmFoldLinear`` / ``nn.LayerNorm`` /
  ``nn.Softmax`` module of the whole model, heads included (``quant_acts.py:81``);
  in ESMFold the only ``nn.Softmax`` module is the IPA softmax;
* range: their top-k statistic (whole tensor per call, BOS/EOS included, batch 1,
  first 50 calls, lower median of the k extremes, mean over calls); k=1 for
  uniform (the 0.685 row), k=2 for pwlq-3 (``structure_prediction/scripts/quant_acts.py:61-62``);
* quantizers: their uniform (per tensor, codes [-128, 127] x 2M/255, unsigned
  [0, 255] x M/255 when the calibrated min >= 0) and their pwlq-3 (static M,
  breakpoint recomputed per call; 8-bit centre + 8-bit [-M, M] tail: 9 bits/value);
* W8: per row (>= 2-D) / per tensor (1-D), in two key filters named for their
  source. ``study-w8``: the published scripts' (``quant_weis.py:38``,
  ``quant_full.py:33``: ``esm.encoder.layer``, ``trunk.block``,
  ``trunk.structure_module``). ``study-w8-notebook``: the notebooks' (``esm.encoder.``,
  ``trunk.block``: adds the stem's final LayerNorm, leaves the structure module
  FP), which the published W8 and W8 + A8 numbers used. Both cast the ESM-2 stem
  to float32 first, on every device, as ``quant_weis.py:29`` and
  ``quant_weis_exp2#cell1`` did. ``study-w8a8-pwlq`` follows ``combine_v1#cell10-11``:
  W8 after the activation quantizers are attached (so their range buffers are
  rounded too), notebook filter, no cast: that notebook does not cast, and the
  stem's dtype there is not recorded (transformers 4.27 halves it under
  ``fp16_esm``, yet ``combine_v2``, also uncast, printed the same W8 RMSE as the
  cast ``quant_weis_exp2``, which suggests float32). Here it is rounded as loaded:
  float16 on CUDA, float32 on CPU.

Runtime as they ran it, and where it cannot be: one sequence per forward, the
model's own chunk size and recycles (``--num-recycles`` still overrides them).
Their A8 runs calibrated and ran on CUDA with the float16 stem transformers
loads; our loader does the same on CUDA, but keeps the stem in float32 on CPU,
where the study has no run to match (a stated difference, not a replication).

Where we deliberately differ: the rotary ``inv_freq`` buffer is not rounded
(their W8 zeroed 12 of 32 frequencies; ``StudyOptions(round_rotary=True)`` does
it, wherever transformers keeps the buffer), a site called fewer than 50 times
averages the calls it saw (theirs averaged zero rows in; never the case in their
runs), and all-zero rows are left unchanged (theirs would become NaN; none
existed). Their ``combine_v2`` and ``quant_full.py`` evaluated float weights
(the W8 model only fed calibration): ``study-w8a8-pwlq`` applies the W8 it names.

The per-part ablation numbers (``quant_acts_exp1-1#cell15``: LayerNorm 0.7313,
Linear 0.7980, ESM-2 0.7872, trunk 0.7673) were not produced by pwlq-3 / top-2:
the same comment block gives 0.7418 for all the sites, where pwlq-3 / top-2
gives 0.7997 (``#cell13``). Their configuration is not recorded in the study's
code. The ``study-a8-pwlq-*`` recipes are what the published package does per
part (pwlq-3, top-2), not a reproduction of those numbers.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ptq_protein.recipes.config import (
    Granularity,
    QuantConfig,
    RangeMethod,
    Scheme,
    SiteKind,
    SpecialTokens,
    StudyOptions,
    TensorQuant,
)

__all__ = ["PRESETS", "DOCS", "STUDY_KINDS", "SCRIPTS_W8_PREFIXES", "NOTEBOOK_W8_PREFIXES"]

STUDY_KINDS = (SiteKind.LINEAR, SiteKind.LAYERNORM, SiteKind.SOFTMAX)
_UNIFORM_K, _PWLQ_K = 1, 2

_W8 = TensorQuant(bits=8, scheme=Scheme.STUDY_UNIFORM, granularity=Granularity.PER_CHANNEL)


def _acts(scheme: Scheme, k: int) -> TensorQuant:
    return TensorQuant(bits=8, scheme=scheme, range_method=RangeMethod.STUDY_TOPK, topk=k)


# W8 key filters, named for their source (see the table above).
SCRIPTS_W8_PREFIXES = ("esm.encoder.layer", "trunk.block", "trunk.structure_module")  # quant_weis.py:38
NOTEBOOK_W8_PREFIXES = ("esm.encoder.", "trunk.block")  # quant_weis_exp2#cell6, combine_v1#cell11


def _recipe(name: str, acts: Optional[TensorQuant], weights: Optional[TensorQuant] = None,
            kinds: Tuple[SiteKind, ...] = STUDY_KINDS, groups: Optional[Tuple[str, ...]] = None,
            include: Tuple[str, ...] = (), exclude: Tuple[str, ...] = (),
            study: StudyOptions = StudyOptions()) -> QuantConfig:
    return QuantConfig(weights=weights, activations=acts, kinds=kinds, groups=groups, include=include,
                       exclude=exclude, quantize_heads=True, study=study, name=name,
                       special_tokens=SpecialTokens.INCLUDE)  # the study quantized every computed row


_PWLQ = _acts(Scheme.STUDY_PWLQ, _PWLQ_K)

PRESETS: Dict[str, QuantConfig] = {
    "study-a8-uniform": _recipe("study-a8-uniform", _acts(Scheme.STUDY_UNIFORM, _UNIFORM_K)),
    "study-a8-pwlq": _recipe("study-a8-pwlq", _PWLQ),
    "study-w8a8-pwlq": _recipe("study-w8a8-pwlq", _PWLQ, _W8),
    "study-w8": _recipe("study-w8", None, _W8,
                        study=StudyOptions(weight_prefixes=SCRIPTS_W8_PREFIXES, cast_float32=True)),
    "study-w8-notebook": _recipe("study-w8-notebook", None, _W8,
                                 study=StudyOptions(weight_prefixes=NOTEBOOK_W8_PREFIXES, cast_float32=True)),
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
    "study-w8": "the study's W8 as its published scripts run it (quant_weis.py): per row / per 1-D tensor over "
                "esm.encoder.layer*, trunk.block*, trunk.structure_module*, stem cast to float32, activations FP",
    "study-w8-notebook": "the study's W8 as its notebooks ran it (the published W8 row): per row / per 1-D tensor "
                         "over esm.encoder.* and trunk.block*, stem cast to float32, activations FP",
    "study-a8-pwlq-layernorm": f"per part: {_PW} on LayerNorm inputs only (the published package per part)",
    "study-a8-pwlq-linear": f"per part: {_PW} on Linear inputs only (the published package per part)",
    "study-a8-pwlq-esm": f"per part: {_PW} on the ESM-2 stem's sites only (esm.*)",
    "study-a8-pwlq-trunk": f"per part: {_PW} on every site outside the ESM-2 stem (trunk, structure module, heads)",
}
