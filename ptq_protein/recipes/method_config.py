"""Configs of the whole-model methods a recipe may add: SmoothQuant, GPTQ, the FFN rotation, the study's runtime.

Small frozen dataclasses like the rest of :mod:`ptq_protein.recipes.config` (which re-exports
them), kept apart so that file stays one screen of per-tensor settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

__all__ = ["SmoothQuantSpec", "GPTQSpec", "StudyOptions", "from_known_fields", "check_rotation_block",
           "check_fold_execution", "PAIR_BITS", "TRUNK_DTYPES"]


def from_known_fields(cls, data: Dict[str, Any], what: str):
    """``cls(**data)``, refusing unknown keys with one line naming them (recipe.json fields)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {what} fields {sorted(unknown)}; known: {sorted(known)}")
    return cls(**data)


def check_rotation_block(block: int, study: bool = False) -> None:
    """``QuantConfig.rotate_ffn``: 0 (off) or the Hadamard block of ESM C's SwiGLU product, a power of two >= 2
    (:mod:`ptq_protein.transforms.rotation`); always 0 in the study's recipes, which rotate nothing."""
    power_of_two = isinstance(block, int) and block >= 2 and not block & (block - 1)
    if isinstance(block, bool) or not (block == 0 or power_of_two):
        raise ValueError(f"rotate_ffn={block!r} must be 0 (no rotation) or a power of two >= 2, the Hadamard block "
                         "of ESM C's SwiGLU product (the w8a8-rotate presets use 128)")
    if study and block:
        raise ValueError("study-* recipes run the study's method, which rotates nothing: drop rotate_ffn")


PAIR_BITS = (None, 8)  # QuantConfig.pair_bits: float pairs, or int8 (ptq_protein.nn.pair_int8)
TRUNK_DTYPES = (None, "bfloat16")  # QuantConfig.trunk_dtype: the model's dtype, or bf16 blocks (nn.trunk_dtype)


def check_fold_execution(pair_bits: Optional[int], trunk_dtype: Optional[str]) -> None:
    """``QuantConfig.pair_bits`` and ``trunk_dtype``: how ESMFold's trunk runs (validated when a config is built)."""
    if pair_bits not in PAIR_BITS:
        raise ValueError(f"pair_bits={pair_bits!r}: use 8 (int8 pair activations) or None (float)")
    if trunk_dtype not in TRUNK_DTYPES:
        raise ValueError(f"trunk_dtype={trunk_dtype!r}: use 'bfloat16' (ESMFold's trunk blocks in bfloat16) or None "
                         "(the model's dtype)")
    if pair_bits is not None and trunk_dtype is not None:
        raise ValueError("pair_bits and trunk_dtype each change how ESMFold's trunk runs and do not combine yet: "
                         "choose one (pair_bits=8 for long sequences, trunk_dtype='bfloat16' for speed)")


@dataclass(frozen=True)
class SmoothQuantSpec:
    """SmoothQuant (Xiao et al. 2023): migrate activation outliers into the weights before quantizing.

    Each LayerNorm -> Linear pair the adapter knows gets per-input-channel factors
    ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``: the LayerNorm's weight and bias
    are divided by ``s``, the Linear's weight columns multiplied by it, so the float
    model computes the same function with flatter activations.
    """

    alpha: float = 0.5
    min_factor: float = 1e-5  # floor of s (and of the maxima), so dead channels do not divide by zero

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"smoothquant alpha={self.alpha} must be in [0, 1] (0.5 is the paper's default)")
        if not self.min_factor > 0:
            raise ValueError(f"smoothquant min_factor={self.min_factor} must be positive")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "SmoothQuantSpec":
        return from_known_fields(cls, data, "smoothquant")


@dataclass(frozen=True)
class GPTQSpec:
    """GPTQ (Frantar et al. 2023): weights quantized column by column with Hessian-based error feedback.

    ``damp`` is the dampening added to the Hessian's diagonal as a fraction of its
    mean; ``act_order`` processes columns by descending Hessian diagonal;
    ``block_size`` is the lazy-update block. ``group_size`` -1 gives one scale per
    output channel, the codes the int8/int4 kernels and the artifact format run;
    the math in :mod:`ptq_protein.quant.gptq` supports groups, quantized models do not yet.
    ``special_rows`` adds the BOS/EOS rows to the Hessian (by default it sums residue rows only, like every other
    calibration statistic): the quantized weight multiplies those rows too, whether they are kept in float or
    quantized, and where they are attention sinks every query reads the error of their keys and values.
    """

    damp: float = 0.01
    act_order: bool = True
    block_size: int = 128
    group_size: int = -1
    special_rows: bool = False

    def __post_init__(self) -> None:
        for name in ("act_order", "special_rows"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"gptq {name}={getattr(self, name)!r} must be true or false")
        for name, kind in (("damp", (int, float)), ("block_size", int), ("group_size", int)):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), kind):
                raise ValueError(f"gptq {name}={getattr(self, name)!r} must be a number")
        if not 0.0 < self.damp < 1.0:
            raise ValueError(f"gptq damp={self.damp} must be in (0, 1) (0.01 is the paper's default)")
        if self.block_size < 1:
            raise ValueError(f"gptq block_size={self.block_size} must be at least 1")
        if self.group_size != -1:
            raise ValueError(f"gptq group_size={self.group_size}: grouped scales are not supported by the int8/int4 "
                             "kernels or the artifact format yet; use group_size=-1 (one scale per output channel)")

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        if not self.special_rows:
            del data["special_rows"]  # absent: residue rows only, as every config was written before the field
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "GPTQSpec":
        return from_known_fields(cls, data, "gptq")


@dataclass(frozen=True)
class StudyOptions:
    """How the study ran its quantization (``study-*`` recipes; see ``ptq_protein.quant.study``).

    ``calls``: calibration statistics come from the first ``calls`` calls of each
    quantizer, one sequence per call (their ``cali_sample_size // cali_batch_size``).
    ``weight_prefixes``: state-dict key prefixes their W8 covers (their notebooks'
    filter: ``esm.encoder.`` and ``trunk.block``; every tensor under them, biases,
    LayerNorm parameters and the activation range buffers included, in that order:
    activation quantizers are attached first). ``round_rotary``: also round the
    rotary ``inv_freq`` buffers as their W8 did (12 of 32 frequencies become 0 at
    head size 64); off by default, a bug we do not replicate unless asked. The
    buffer is found wherever the installed library keeps it (transformers 5:
    one shared ``esm.rotary_embeddings.inv_freq``; 4.x: one per layer).
    ``cast_float32``: a top-level module (ESMFold's ``esm``) holding a
    half-precision tensor that W8 rounds is cast to float32 first and stays
    float32, as ``quant_weis.py:29`` (``model.esm = model.esm.float()``) did;
    off: rounded in the dtype the model was loaded in.
    """

    calls: int = 50
    weight_prefixes: Tuple[str, ...] = ("esm.encoder.", "trunk.block")
    round_rotary: bool = False
    cast_float32: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.calls, bool) or not isinstance(self.calls, int) or self.calls < 1:
            raise ValueError(f"study calls={self.calls!r} must be a positive integer (the study used 50)")
        prefixes = (self.weight_prefixes,) if isinstance(self.weight_prefixes, str) else tuple(self.weight_prefixes)
        if not prefixes or not all(isinstance(p, str) for p in prefixes):
            raise ValueError(f"study weight_prefixes={self.weight_prefixes!r} must be state-dict key prefixes, "
                             "e.g. ('esm.encoder.', 'trunk.block'); ('',) is every key")
        object.__setattr__(self, "weight_prefixes", prefixes)

    def to_dict(self) -> Dict[str, Any]:
        return {"calls": self.calls, "weight_prefixes": list(self.weight_prefixes), "round_rotary": self.round_rotary,
                "cast_float32": self.cast_float32}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "StudyOptions":
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown study fields {sorted(unknown)}; known: calls, weight_prefixes, round_rotary, "
                             "cast_float32")
        return cls(**{k: (tuple(v) if k == "weight_prefixes" else v) for k, v in data.items()})
