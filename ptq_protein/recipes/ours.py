"""ptq-protein's own recipes: uniform and piecewise-linear, weights and activations.

Each family of recipes is one file in this folder exporting ``PRESETS`` (name ->
QuantConfig) and ``DOCS`` (name -> one line); :mod:`ptq_protein.recipes.presets` merges them.

Every recipe here keeps the LM's BOS/EOS rows in floating point at its activation
sites (``special_tokens="float"``, the QuantConfig default; measured against
``include`` and ``clip`` by scripts/bench/special_tokens.py): an "A8" recipe stores
8 bits per activation value on residue and padding rows, and those two rows per
sequence stay in the model's dtype.
"""

from __future__ import annotations

from typing import Dict

from ptq_protein.recipes.config import (
    BreakpointMethod,
    GPTQSpec,
    Granularity,
    QuantConfig,
    RangeMethod,
    Scheme,
    SiteKind,
    TensorQuant,
)

__all__ = ["PRESETS", "DOCS"]


def per_channel_weights(bits: int) -> TensorQuant:
    return TensorQuant(bits=bits, granularity=Granularity.PER_CHANNEL, symmetric=True)


def _uniform_acts(bits: int) -> TensorQuant:
    # Static per-tensor symmetric, codes [-127, 127], range from our top-k median over masked residue
    # values (k=100). Modelled on the study's baseline but not it: see study-a8-uniform for theirs.
    return TensorQuant(bits=bits, scheme=Scheme.UNIFORM, symmetric=True, range_method=RangeMethod.TOPK)


def pwlq_acts(bits: int, shared_centre: bool = False) -> TensorQuant:
    # Asymmetric PWLQ: negative and positive sides get their own range and breakpoint,
    # which is what the one-sided pre-LayerNorm outliers need. Breakpoints (and the
    # centre/tail code split) come from an MSE search on the calibration histogram over
    # the observed range: the tail pieces carry the outliers, so nothing is clipped.
    # shared_centre: both centre pieces on one step (the integer-friendly PWLQ: one dense integer GEMM).
    method = BreakpointMethod.MSE_SHARED_STEP if shared_centre else BreakpointMethod.MSE
    return TensorQuant(bits=bits, scheme=Scheme.PWLQ, symmetric=False, range_method=RangeMethod.MINMAX,
                       breakpoint_method=method)


_LINEAR_LN = (SiteKind.LINEAR, SiteKind.LAYERNORM)

PRESETS: Dict[str, QuantConfig] = {
    "fp": QuantConfig(weights=None, activations=None, kinds=(), name="fp"),
    "w8a8-uniform": QuantConfig(weights=per_channel_weights(8), activations=_uniform_acts(8), kinds=_LINEAR_LN,
                                name="w8a8-uniform"),
    "w8a8-pwlq": QuantConfig(weights=per_channel_weights(8), activations=pwlq_acts(8), kinds=_LINEAR_LN,
                             name="w8a8-pwlq"),
    "a8-uniform": QuantConfig(weights=None, activations=_uniform_acts(8), kinds=_LINEAR_LN, name="a8-uniform"),
    "a8-pwlq": QuantConfig(weights=None, activations=pwlq_acts(8), kinds=_LINEAR_LN, name="a8-pwlq"),
    "w8-only": QuantConfig(weights=per_channel_weights(8), activations=None, kinds=(SiteKind.LINEAR,), name="w8-only"),
    "w4-only": QuantConfig(weights=per_channel_weights(4), activations=None, kinds=(SiteKind.LINEAR,), name="w4-only"),
    "w4a8-pwlq": QuantConfig(weights=per_channel_weights(4), activations=pwlq_acts(8), kinds=_LINEAR_LN,
                             name="w4a8-pwlq"),
    "w6a6-pwlq": QuantConfig(weights=per_channel_weights(6), activations=pwlq_acts(6), kinds=_LINEAR_LN,
                             name="w6a6-pwlq"),
    "w8a8-pwlq-int": QuantConfig(weights=per_channel_weights(8), activations=pwlq_acts(8, shared_centre=True),
                                 kinds=_LINEAR_LN, name="w8a8-pwlq-int"),
    "w8a8-pwlq-all": QuantConfig(weights=per_channel_weights(8), activations=pwlq_acts(8),
                                 kinds=_LINEAR_LN + (SiteKind.MATMUL,), name="w8a8-pwlq-all"),
    "w8a8-uniform-per-channel": QuantConfig(
        weights=per_channel_weights(8), kinds=_LINEAR_LN, name="w8a8-uniform-per-channel",
        activations=TensorQuant(bits=8, granularity=Granularity.PER_CHANNEL, range_method=RangeMethod.MINMAX)),
    "w8a8-pwlq-dynamic": QuantConfig(
        weights=per_channel_weights(8), kinds=_LINEAR_LN, name="w8a8-pwlq-dynamic",
        activations=TensorQuant(bits=8, scheme=Scheme.PWLQ, symmetric=False, runtime_breakpoints=True,
                                breakpoint_method=BreakpointMethod.GAUSSIAN)),
    "w8a8-dynamic": QuantConfig(weights=per_channel_weights(8),
                                activations=TensorQuant(bits=8, granularity=Granularity.PER_TOKEN, dynamic=True),
                                kinds=(SiteKind.LINEAR,), name="w8a8-dynamic"),
}
# ESM C only: w8a8-dynamic after rotating each SwiGLU product online (Hadamard blocks of 128 channels). On a random
# 12 x 384 ESM C its last-layer error is 3.63% against w8a8-dynamic's 4.13% (planted outliers: 3.38% and 3.73%;
# scripts/bench/esmc_study.py, BENCHMARKS.md). With 16-bit weights (activations alone) blocks of 64, 128 and 256
# gave 1.99%, 1.97% and 1.97% (unrotated: 2.77%): 128 is as good as 256 at half the multiply-adds.
ROTATION_BLOCK = 128
PRESETS["w8a8-rotate"] = PRESETS["w8a8-dynamic"].replace(rotate_ffn=ROTATION_BLOCK, name="w8a8-rotate")
PRESETS["w8a8-rotate-gptq"] = PRESETS["w8a8-rotate"].replace(gptq=GPTQSpec(damp=0.01, act_order=True, block_size=128,
                                                                           group_size=-1), name="w8a8-rotate-gptq")
# ESMFold. On random ESMFolds at the v1 trunk's widths (8 blocks, 10 cameo139 targets), every 8-bit stem tried moved
# the fold: TM to the FP fold 0.72-0.95 for W8 + PWLQ A8, 0.68-0.90 for W8A8 per-token, 0.79-0.94 for W8 alone, as
# much as multiplying the stem's weights by 1 + 1% Gaussian noise; the trunk's pair operations in bfloat16 stayed at
# or above the perturbation control (the stem cast to bfloat16) and take most of a fold's time. So ESMFold's 8-bit
# default keeps the stem in float and runs the pair operations in bfloat16 (bf16-trunk, nn/trunk_dtype.py says why
# not the sequence side); w8a8-pwlq-stem adds the study's 8-bit stem (BENCHMARKS.md, "ESMFold as typed").
PRESETS["bf16-trunk"] = QuantConfig(weights=None, activations=None, kinds=(), trunk_dtype="bfloat16",
                                    name="bf16-trunk")
PRESETS["w8a8-pwlq-stem"] = PRESETS["w8a8-pwlq"].replace(groups=("esm",), trunk_dtype="bfloat16",
                                                         name="w8a8-pwlq-stem")

DOCS: Dict[str, str] = {
    "fp": "no quantization (the full-precision reference)",
    "w8a8-uniform": "W8 per-channel + static per-tensor symmetric uniform A8 (codes [-127,127], top-100 of residue "
                    "values) on Linear and LayerNorm inputs; ours, not the study's (that is study-a8-uniform)",
    "w8a8-pwlq": "W8 per-channel + static asymmetric PWLQ A8 (8 bits/value, range and breakpoints calibrated on "
                 "residue values) on Linear and LayerNorm inputs; ours, not the study's pwlq-3 (study-w8a8-pwlq)",
    "w8a8-pwlq-int": "w8a8-pwlq with both centre pieces on one step (integer-friendly: the centre is one integer "
                     "GEMM with an integer zero point, only the tails need a correction)",
    "a8-uniform": ("uniform A8 only (as in w8a8-uniform), weights in floating point; "
                   "the study's row is study-a8-uniform"),
    "a8-pwlq": "piecewise-linear A8 only, weights in floating point",
    "w8-only": "W8 per-channel weights only, activations in floating point",
    "w4-only": "W4 per-channel weights only",
    "w4a8-pwlq": "W4 per-channel + piecewise-linear A8",
    "w6a6-pwlq": "W6 per-channel + piecewise-linear A6",
    "w8a8-pwlq-all": "w8a8-pwlq plus the attention score/probability matmuls and the trunk's triangle einsums",
    "w8a8-uniform-per-channel": "W8 per-channel + static per-channel symmetric uniform A8 (min-max; backend='fake' "
                                "only: a per-channel input scale does not factor out of an integer GEMM)",
    "w8a8-pwlq-dynamic": "W8 per-channel + PWLQ A8 with range and breakpoints from each tensor at run time "
                         "(the study's run-time variant; no calibration)",
    "w8a8-dynamic": "W8 per-channel + dynamic per-token symmetric A8 on Linear inputs (no calibration needed)",
    "w8a8-rotate": "ESM C only: w8a8-dynamic (W8 per-channel symmetric, A8 per-token dynamic symmetric, on Linear "
                   "inputs) after an online Hadamard rotation of each SwiGLU product (blocks of 128 channels, run in "
                   "float32 at inference; ffn.3's weight rotated to match, so the float model is unchanged); no "
                   "calibration needed",
    "bf16-trunk": "ESMFold (default of --bits 8): the trunk blocks' pair operations (triangle updates and "
                  "attentions, pair transition) store their Linear weights in bfloat16 (16 bits) and run in bfloat16 "
                  "(autocast: LayerNorm and softmax float32) where the device has native bfloat16, else in float32; "
                  "the blocks' sequence side, the ESM-2 stem, structure module and heads float32; nothing calibrated",
    "w8a8-pwlq-stem": "ESMFold: w8a8-pwlq on the ESM-2 stem (W8 per-channel codes, static PWLQ A8 on its Linear and "
                      "LayerNorm inputs, calibrated through the stem alone), plus bf16-trunk (the trunk's pair "
                      "operations in bfloat16); the rest float32",
    "w8a8-rotate-gptq": "ESM C only: w8a8-rotate with its W8 per-channel symmetric weights rounded by GPTQ (damp "
                        "0.01, act order; needs calibration sequences) after the rotation; A8 per-token dynamic "
                        "symmetric; online Hadamard on the SwiGLU product (blocks of 128 channels, float32)",
}
