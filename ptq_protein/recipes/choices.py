"""The named choices a quantization config is made of (schemes, granularities, ranges, sites, backends, ...)."""

from __future__ import annotations

import enum

__all__ = ["Scheme", "FP8Format", "Granularity", "RangeMethod", "BreakpointMethod", "SiteKind", "Backend", "Engine",
           "SpecialTokens", "as_choice"]


class Scheme(str, enum.Enum):
    """How values map to codes."""

    UNIFORM = "uniform"
    PWLQ = "pwlq"  # piecewise-linear (Fang et al. 2020)
    FP8 = "fp8"  # scaled 8-bit floating point (Micikevicius et al. 2022), format in TensorQuant.fp8_format
    # The PTQ4Protein study's quantizers, bit for bit (ptq_protein.quant.study); only in study-* recipes.
    STUDY_UNIFORM = "study_uniform"  # per tensor: signed [-2^(b-1), 2^(b-1)-1] x 2M/(2^b-1), or unsigned when min >= 0
    STUDY_PWLQ = "study_pwlq"  # pwlq-3: static M, per-call breakpoint, b-bit centre + b-bit [-M, M] tail (b+1 bits)


class FP8Format(str, enum.Enum):
    """Which 8-bit float: E4M3 (more precision, max 448) or E5M2 (more range, max 57344)."""

    E4M3 = "e4m3"
    E5M2 = "e5m2"


class Granularity(str, enum.Enum):
    """Which values share one set of quantization parameters."""

    PER_TENSOR = "per_tensor"
    PER_CHANNEL = "per_channel"  # weights: per output channel; activations: per last-dim channel
    PER_TOKEN = "per_token"  # activations only, always dynamic


class RangeMethod(str, enum.Enum):
    """How a calibrated activation range is chosen from the observed statistics."""

    MINMAX = "minmax"
    # Ours: the k-th most extreme residue value (padding and BOS/EOS masked out) of a sample of at
    # most 2^16 values per calibration batch, median over batches. Not the study's statistic.
    TOPK = "topk"
    # The study's: per call (whole tensor, BOS/EOS included, batch 1, first 50 calls only) the lower
    # median of the k most extreme values, mean over calls (ptq_protein.quant.study_observer).
    STUDY_TOPK = "study_topk"
    PERCENTILE = "percentile"
    MSE = "mse"  # clipping range minimising the expected squared error on the histogram


class BreakpointMethod(str, enum.Enum):
    """How PWLQ breakpoints are chosen."""

    GAUSSIAN = "gaussian"  # optimality condition for a Gaussian, solved numerically
    LAPLACIAN = "laplacian"
    GAUSSIAN_FIT = "gaussian_fit"  # the paper's closed-form fit
    LAPLACIAN_FIT = "laplacian_fit"
    MSE = "mse"  # distribution-free search on the calibration histogram
    MSE_SHARED_STEP = "mse_shared_step"  # MSE, then both centre pieces on one step (one integer GEMM for the centre)


class SiteKind(str, enum.Enum):
    """Where quantization can happen."""

    LINEAR = "linear"  # nn.Linear (and subclasses): weight and/or input
    LAYERNORM = "layernorm"  # the input of a LayerNorm (the residual stream: large one-sided outliers)
    MATMUL = "matmul"  # operands of attention score/probability matmuls and triangle einsums
    SOFTMAX = "softmax"  # the input of an nn.Softmax module (ESMFold: the IPA logits); study-* recipes only


class Backend(str, enum.Enum):
    """How quantized modules execute."""

    FAKE = "fake"  # simulate: quantize then dequantize, float math
    INT8 = "int8"  # integer GEMMs (Triton on CUDA; oneDNN on CPU, or the exact torch reference)


class Engine(str, enum.Enum):
    """Which integer GEMM ``backend="int8"`` runs (a run-time choice, not part of a recipe)."""

    AUTO = "auto"  # oneDNN for CPU sites it handles, else the reference
    ONEDNN = "onednn"  # the CPU fast path (ptq_protein.nn.cpu_int8)
    REFERENCE = "reference"  # the exact torch integer reference (Triton kernels on CUDA)


class SpecialTokens(str, enum.Enum):
    """What happens to the language model's BOS/EOS (CLS/EOS) positions at activation sites.

    They are computed like residues but carry the largest activations of ESM
    models (tens of times the residues' range), so a range fitted to residues
    clips them. Padding is never calibrated on, whatever the choice.
    """

    FLOAT = "float"  # calibrate on residues; at run time BOS/EOS rows bypass the quantizer (token-wise FP)
    INCLUDE = "include"  # calibrate on residues and BOS/EOS; one quantizer for every row
    CLIP = "clip"  # calibrate on residues; BOS/EOS quantized with that range (clipped): the old behaviour


def as_choice(cls, value):
    """``value`` as member of ``cls``, refused in words when it names none."""
    try:
        return value if isinstance(value, cls) else cls(value)
    except ValueError as err:
        choices = ", ".join(m.value for m in cls)
        raise ValueError(f"unknown {cls.__name__} {value!r}; choose one of: {choices}") from err
