"""Activation quantizer modules from a site's statistics (quantizer parameters -> module).

The math lives in :mod:`ptq_protein.quant.fit`; this file only wraps its results in
:class:`~ptq_protein.nn.modules.ActQuantizer`. The other names are re-exported for callers
that reach quantizer parameters through the module layer.
"""

from __future__ import annotations

import torch

from ptq_protein.nn.modules import ActQuantizer
from ptq_protein.quant.fit import (
    calibrated_range,
    fp8_activation_scale,
    needs_calibration,
    pwlq_codebook_for_values,
    pwlq_from_range,
    quantize_weight,
)
from ptq_protein.quant.uniform import choose_qparams
from ptq_protein.recipes.config import Scheme, TensorQuant

__all__ = ["needs_calibration", "quantize_weight", "activation_quantizer", "pwlq_codebook_for_values",
           "calibrated_range"]


def activation_quantizer(spec: TensorQuant, stats=None) -> ActQuantizer:
    """The quantizer of one activation site: calibrated from ``stats`` when static."""
    if not needs_calibration(spec):
        return ActQuantizer(spec)
    if spec.scheme is Scheme.FP8:
        scale = fp8_activation_scale(stats, spec)
        return ActQuantizer(spec, scale=scale, zero_point=torch.zeros(scale.shape, dtype=torch.int32))
    lo, hi = calibrated_range(stats, spec)
    if spec.scheme is Scheme.PWLQ:
        cb = pwlq_from_range(float(lo.min()), float(hi.max()), float(stats.moments.std()), spec, stats.histogram)
        return ActQuantizer(spec, codebook=cb)
    scale, zp = choose_qparams(lo.reshape(-1), hi.reshape(-1), spec.bits, spec.symmetric)
    if scale.numel() == 1:
        scale, zp = scale.reshape(()), zp.reshape(())
    return ActQuantizer(spec, scale=scale, zero_point=zp)
