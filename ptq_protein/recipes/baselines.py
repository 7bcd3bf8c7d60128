"""The methods people compare against: SmoothQuant, GPTQ and FP8, on ptq-protein's sites and kernels.

* SmoothQuant (Xiao et al. 2023, arXiv:2211.10438): per-channel smoothing folded
  into the LayerNorms, then static per-tensor A8 on Linear inputs (the paper
  keeps LayerNorms in floating point), or PWLQ on the smoothed activations.
* GPTQ (Frantar et al. 2023, arXiv:2210.17323): Hessian-aware W4/W8 codes, the
  same symmetric per-channel codes the int8/int4 kernels run.
* FP8 (Micikevicius et al. 2022, arXiv:2209.05433): E4M3 weights (per channel)
  and activations (static per tensor), as in torchao / ModelOpt.
"""

from __future__ import annotations

from typing import Dict

from ptq_protein.recipes.config import (
                                FP8Format,
                                GPTQSpec,
                                Granularity,
                                QuantConfig,
                                RangeMethod,
                                Scheme,
                                SiteKind,
                                SmoothQuantSpec,
                                SpecialTokens,
                                TensorQuant,
)
from ptq_protein.recipes.ours import per_channel_weights, pwlq_acts

__all__ = ["PRESETS", "DOCS"]

_LINEAR = (SiteKind.LINEAR,)
_LINEAR_LN = (SiteKind.LINEAR, SiteKind.LAYERNORM)
# SmoothQuant's activations: static per-tensor symmetric, range = calibrated max (the paper's setting).
_SQ_ACTS = TensorQuant(bits=8, scheme=Scheme.UNIFORM, symmetric=True, range_method=RangeMethod.MINMAX)
# The same, asymmetric (a GELU output is one-sided: a symmetric range wastes half its codes on it).
_ASYM_ACTS = TensorQuant(bits=8, scheme=Scheme.UNIFORM, symmetric=False, range_method=RangeMethod.MINMAX)
_FP8 = FP8Format.E4M3
# Per token, asymmetric, from each row's own range at run time: no calibrated range for a LayerNorm-gain or sink
# row to stretch. Symmetric rows (which --engine openvino would take) erred 1.28% against 0.95% on the bench's
# LayerNorm-gain model at the same CPU time, and that engine gained nothing on them (BENCHMARKS.md).
_TOKEN_ACTS = TensorQuant(bits=8, scheme=Scheme.UNIFORM, granularity=Granularity.PER_TOKEN, symmetric=False,
                          dynamic=True)
# The first transformer layer's attention Linears (q, k, v and the output projection), by each family's module names
# (fair-esm ESM-2, transformers ESM-2 / ESMFold's stem, ESM C): where LayerNorm-gain channels cost most (the first
# layer carried about three quarters of the squared error on the bench's shape, its q and k most). Its FFN in int8
# too cost 0.84% -> 1.03% there (BENCHMARKS.md) and saves two thirds of the float layer's time.
FIRST_ATTENTION = ("layers.0.self_attn.*", "*encoder.layer.0.attention.*", "transformer.blocks.0.attn.*")
# The Linears that read a LayerNorm's output (q, k, v and the FFN's first), by each family's module names: where
# LayerNorm-gain channels enter a GEMM. Per-token rows there and static ranges at the out-projection and second FFN
# inputs measured as accurate as per-token rows everywhere, at less of their cost (BENCHMARKS.md).
LAYERNORM_INPUTS = ("*self_attn.[qkv]_proj", "*.fc1", "*attention.self.*", "*intermediate.dense",
                    "*attn.layernorm_qkv.1", "*ffn.1")

PRESETS: Dict[str, QuantConfig] = {
    "w8a8-smoothquant": QuantConfig(weights=per_channel_weights(8), activations=_SQ_ACTS, kinds=_LINEAR,
                                    smoothquant=SmoothQuantSpec(), name="w8a8-smoothquant"),
    "w8a8-smoothquant-gptq": QuantConfig(weights=per_channel_weights(8), activations=_ASYM_ACTS, kinds=_LINEAR,
                                         smoothquant=SmoothQuantSpec(), gptq=GPTQSpec(),
                                         special_tokens=SpecialTokens.INCLUDE, name="w8a8-smoothquant-gptq"),
    "w8a8-smoothquant-gptq-bos": QuantConfig(weights=per_channel_weights(8), activations=_ASYM_ACTS, kinds=_LINEAR,
                                             smoothquant=SmoothQuantSpec(alpha=0.4), gptq=GPTQSpec(special_rows=True),
                                             special_tokens=SpecialTokens.INCLUDE, name="w8a8-smoothquant-gptq-bos"),
    "w8a8-smoothquant-gptq-pertoken": QuantConfig(weights=per_channel_weights(8), activations=_TOKEN_ACTS,
                                                  kinds=_LINEAR, smoothquant=SmoothQuantSpec(),
                                                  gptq=GPTQSpec(special_rows=True), exclude=FIRST_ATTENTION,
                                                  name="w8a8-smoothquant-gptq-pertoken"),
    "w8a8-smoothquant-gptq-lntoken": QuantConfig(weights=per_channel_weights(8), activations=_ASYM_ACTS,
                                                 activations_at=tuple((glob, _TOKEN_ACTS) for glob in LAYERNORM_INPUTS),
                                                 kinds=_LINEAR, smoothquant=SmoothQuantSpec(),
                                                 gptq=GPTQSpec(special_rows=True), exclude=FIRST_ATTENTION,
                                                 name="w8a8-smoothquant-gptq-lntoken"),
    "w8a8-smoothquant-pwlq": QuantConfig(weights=per_channel_weights(8), activations=pwlq_acts(8), kinds=_LINEAR_LN,
                                         smoothquant=SmoothQuantSpec(), name="w8a8-smoothquant-pwlq"),
    "w4a8-gptq-pwlq": QuantConfig(weights=per_channel_weights(4), activations=pwlq_acts(8), kinds=_LINEAR_LN,
                                  gptq=GPTQSpec(),
                                  name="w4a8-gptq-pwlq"),
    "w8a8-gptq-pwlq": QuantConfig(weights=per_channel_weights(8), activations=pwlq_acts(8), kinds=_LINEAR_LN,
                                  gptq=GPTQSpec(),
                                  name="w8a8-gptq-pwlq"),
    "w4-gptq": QuantConfig(weights=per_channel_weights(4), activations=None, kinds=_LINEAR, gptq=GPTQSpec(),
                           name="w4-gptq"),
    "w8a8-fp8": QuantConfig(
        weights=TensorQuant(bits=8, scheme=Scheme.FP8, granularity=Granularity.PER_CHANNEL, fp8_format=_FP8),
        activations=TensorQuant(bits=8, scheme=Scheme.FP8, range_method=RangeMethod.MINMAX, fp8_format=_FP8),
        kinds=_LINEAR, name="w8a8-fp8"),
}

DOCS: Dict[str, str] = {
    "w8a8-smoothquant": "SmoothQuant (alpha 0.5) + W8 per-channel + static per-tensor A8 on Linear inputs "
                        "(Xiao et al. 2023)",
    "w8a8-smoothquant-gptq": "SmoothQuant (alpha 0.5), then GPTQ W8 per-channel + static per-tensor asymmetric A8 "
                             "(min-max) on Linear inputs, BOS/EOS calibrated and quantized with the residues (one "
                             "quantizer for every row: no float side path)",
    "w8a8-smoothquant-gptq-bos": "w8a8-smoothquant-gptq with SmoothQuant alpha 0.4 and GPTQ's Hessian summing the "
                                 "BOS/EOS rows too (the int8 weights multiply them; where they are attention sinks, "
                                 "every query reads their keys' error)",
    "w8a8-smoothquant-gptq-pertoken": "SmoothQuant (alpha 0.5), then GPTQ W8 per-channel (its Hessian with the "
                                      "BOS/EOS rows) + dynamic per-token asymmetric A8 on Linear inputs; BOS/EOS "
                                      "rows and the first layer's attention Linears in floating point",
    "w8a8-smoothquant-gptq-lntoken": "w8a8-smoothquant-gptq-pertoken with its per-token rows only where a "
                                     "LayerNorm's output enters (q, k, v, the first FFN Linear); static per-tensor "
                                     "asymmetric A8 (min-max) at the out-projection and second FFN inputs",
    "w8a8-smoothquant-pwlq": "SmoothQuant, then w8a8-pwlq on the smoothed model (Linear and LayerNorm inputs)",
    "w4a8-gptq-pwlq": "GPTQ W4 per-channel (act-order, sequential; Frantar et al. 2023) + piecewise-linear A8",
    "w8a8-gptq-pwlq": "GPTQ W8 per-channel + piecewise-linear A8",
    "w4-gptq": "GPTQ W4 per-channel weights only",
    "w8a8-fp8": "FP8 E4M3: per-channel weights + static per-tensor activations on Linear inputs "
                "(fake backend only; Micikevicius et al. 2022)",
}
