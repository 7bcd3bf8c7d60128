"""Quantizer math (uniform and piecewise-linear) and streaming calibration observers.

Pure tensor functions and small state objects with no knowledge of models; the
module swap, configs and calibration hooks build on them. Layout:

* :mod:`.uniform` - affine qparams, quantize/dequantize, per-token dynamic.
* :mod:`.codebook` - :class:`PiecewiseCodebook`, its encoder and decoder.
* :mod:`.pwlq` - PWLQ codebook builders (1-3 breakpoints per side).
* :mod:`.breakpoints` - Gaussian/Laplacian optimal breakpoints (numeric, closed form).
* :mod:`.breakpoint_search` - histogram-MSE breakpoint and code-split search.
* :mod:`.observers`, :mod:`.histogram`, :mod:`.stats` - bounded-memory observers.
* :mod:`.ranges` - range choosers (min-max, top-k, percentile, MSE).
* :mod:`.metrics` - MSE and SQNR.
* :mod:`.hadamard` - Hadamard rotations (the online rotation of ESM C's SwiGLU product).
"""

from ptq_protein.quant.breakpoint_search import PwlqSearchResult, search_pwlq, uniform_levels
from ptq_protein.quant.breakpoints import (
    Distribution,
    approx_breakpoint,
    breakpoint_from_stats,
    breakpoint_objective,
    optimal_breakpoint,
)
from ptq_protein.quant.codebook import (
    PiecewiseCodebook,
    codebook_step_function,
    pwlq_dequantize,
    pwlq_fake_quantize,
    pwlq_quantize,
    uniform_codebook,
)
from ptq_protein.quant.histogram import HistogramObserver, expected_sq_error
from ptq_protein.quant.metrics import quantization_mse, sqnr_db
from ptq_protein.quant.observers import MinMaxObserver, NonFiniteError, TopKObserver, check_finite
from ptq_protein.quant.pwlq import asymmetric_pwlq, pwlq_from_breakpoints, symmetric_pwlq
from ptq_protein.quant.ranges import (
    UniformRangeResult,
    minmax_range,
    mse_uniform_range,
    percentile_range,
    pwlq_search_range,
    topk_range,
)
from ptq_protein.quant.stats import MomentsObserver
from ptq_protein.quant.uniform import (
    SCALE_FLOOR,
    choose_qparams,
    code_dtype,
    dequantize,
    dynamic_per_token,
    fake_quantize,
    per_channel_minmax,
    qrange,
    quantize,
)

__all__ = [
    "Distribution",
    "HistogramObserver",
    "MinMaxObserver",
    "MomentsObserver",
    "NonFiniteError",
    "PiecewiseCodebook",
    "PwlqSearchResult",
    "SCALE_FLOOR",
    "TopKObserver",
    "UniformRangeResult",
    "approx_breakpoint",
    "asymmetric_pwlq",
    "breakpoint_from_stats",
    "breakpoint_objective",
    "check_finite",
    "choose_qparams",
    "code_dtype",
    "codebook_step_function",
    "dequantize",
    "dynamic_per_token",
    "expected_sq_error",
    "fake_quantize",
    "minmax_range",
    "mse_uniform_range",
    "optimal_breakpoint",
    "per_channel_minmax",
    "percentile_range",
    "pwlq_dequantize",
    "pwlq_fake_quantize",
    "pwlq_from_breakpoints",
    "pwlq_quantize",
    "pwlq_search_range",
    "qrange",
    "quantization_mse",
    "quantize",
    "search_pwlq",
    "sqnr_db",
    "symmetric_pwlq",
    "topk_range",
    "uniform_codebook",
    "uniform_levels",
]
