"""Quantization configuration: small frozen dataclasses, validated on construction.

A :class:`QuantConfig` says *what* is quantized (site kinds, groups, name globs)
and *how* (one :class:`TensorQuant` for weights, one for activations). It
round-trips through ``to_dict``/``from_dict`` so that an artifact's
``recipe.json`` can rebuild it exactly.
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ptq_protein.recipes.choices import (
    Backend,
    BreakpointMethod,
    Engine,
    FP8Format,
    Granularity,
    RangeMethod,
    Scheme,
    SiteKind,
    SpecialTokens,
    as_choice,
)
from ptq_protein.recipes.method_config import (
    GPTQSpec,
    SmoothQuantSpec,
    StudyOptions,
    check_fold_execution,
    check_rotation_block,
)
from ptq_protein.recipes.method_config import from_known_fields as _from_dict

__all__ = ["Scheme", "Granularity", "RangeMethod", "BreakpointMethod", "SiteKind", "Backend", "Engine", "FP8Format",
           "SpecialTokens", "TensorQuant", "SmoothQuantSpec", "GPTQSpec", "StudyOptions", "QuantConfig",
           "CONFIG_VERSION"]

CONFIG_VERSION = 1
MIN_BITS, MAX_BITS = 2, 16


@dataclass(frozen=True)
class TensorQuant:
    """How one kind of tensor (weights or activations) is quantized.

    `dynamic` activations get their parameters from each tensor at run time;
    static ones from calibration. `runtime_breakpoints` recomputes our PWLQ's
    range *and* breakpoints from every tensor (fully dynamic). It is not the
    study's variant: theirs (`Scheme.STUDY_PWLQ`) keeps a static calibrated
    range and recomputes only the breakpoint.
    """

    bits: int = 8
    scheme: Scheme = Scheme.UNIFORM
    symmetric: bool = True
    granularity: Granularity = Granularity.PER_TENSOR
    dynamic: bool = False
    range_method: RangeMethod = RangeMethod.MINMAX
    percentile: float = 99.99
    topk: int = 100
    breakpoint_method: BreakpointMethod = BreakpointMethod.MSE
    breakpoints: int = 1
    runtime_breakpoints: bool = False
    fp8_format: FP8Format = FP8Format.E4M3

    def __post_init__(self) -> None:
        for name, cls in (("scheme", Scheme), ("granularity", Granularity), ("range_method", RangeMethod),
                          ("breakpoint_method", BreakpointMethod), ("fp8_format", FP8Format)):
            object.__setattr__(self, name, as_choice(cls, getattr(self, name)))
        if isinstance(self.bits, bool) or not isinstance(self.bits, int):
            raise TypeError(f"bits must be an integer, got {self.bits!r}")
        if not MIN_BITS <= self.bits <= MAX_BITS:
            raise ValueError(f"bits={self.bits} is outside {MIN_BITS}..{MAX_BITS}; pick a width in that range "
                             "(8 is usual)")
        if self.scheme is Scheme.PWLQ and self.bits < 3:
            raise ValueError(f"piecewise-linear quantization needs at least 3 bits (got {self.bits}); use "
                             "uniform for 2 bits")
        if not 1 <= self.breakpoints <= 3:
            raise ValueError(f"breakpoints={self.breakpoints} must be 1, 2 or 3 per side")
        if not 50.0 < self.percentile <= 100.0:
            raise ValueError(f"percentile={self.percentile} must be in (50, 100]")
        if self.topk < 1:
            raise ValueError(f"topk={self.topk} must be at least 1")
        if self.granularity is Granularity.PER_TOKEN and not self.dynamic:
            object.__setattr__(self, "dynamic", True)  # per-token parameters only exist at run time
        if self.scheme is Scheme.PWLQ and self.granularity is not Granularity.PER_TENSOR:
            raise ValueError("piecewise-linear quantization is per-tensor here; use granularity='per_tensor'")
        if self.runtime_breakpoints and self.scheme is not Scheme.PWLQ:
            raise ValueError("runtime_breakpoints only applies to scheme='pwlq'")
        if self.scheme is Scheme.FP8 and (self.bits != 8 or not self.symmetric):
            raise ValueError(f"scheme='fp8' is an 8-bit symmetric float format (got bits={self.bits}, "
                             f"symmetric={self.symmetric}); use bits=8, symmetric=True")
        self._check_study()

    @property
    def is_study(self) -> bool:
        return self.scheme in _STUDY_SCHEMES

    def _check_study(self) -> None:
        if (self.range_method is RangeMethod.STUDY_TOPK) and not self.is_study:
            raise ValueError("range_method='study_topk' is the study's statistic: use it with scheme "
                             "'study_uniform' or 'study_pwlq'")
        if not self.is_study:
            return
        if self.dynamic or self.granularity is Granularity.PER_TOKEN or not self.symmetric:
            raise ValueError(f"scheme={self.scheme.value!r} is the study's static symmetric quantizer: "
                             "use dynamic=False, symmetric=True and per_tensor (activations) or per_channel (weights)")
        if self.topk > _STUDY_MAX_TOPK:
            raise ValueError(f"topk={self.topk}: the study kept the {_STUDY_MAX_TOPK} extremes of each call; "
                             f"use k <= {_STUDY_MAX_TOPK}")

    def to_dict(self) -> Dict[str, Any]:
        return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "TensorQuant":
        return _from_dict(cls, data, "quantizer")

    def describe(self) -> str:
        """Short human label, e.g. ``8-bit pwlq per_tensor static``."""
        if self.scheme is Scheme.STUDY_PWLQ:
            return (f"{self.bits}-bit study_pwlq ({self.bits + 1} bits/value: {self.bits}-bit centre + "
                    f"{self.bits}-bit [-M, M] tail) static range, per-call breakpoint")
        mode = "dynamic" if self.dynamic else "static"
        sym = "sym" if self.symmetric else "asym"
        scheme = f"fp8-{self.fp8_format.value}" if self.scheme is Scheme.FP8 else self.scheme.value
        return f"{self.bits}-bit {scheme} {sym} {self.granularity.value} {mode}"


_STUDY_SCHEMES = (Scheme.STUDY_UNIFORM, Scheme.STUDY_PWLQ)
_STUDY_MAX_TOPK = 1000  # piecewise_quant/quant_acts.py:16 topk=1000 values stored per call


_DEFAULT_EXCLUDE = ()  # heads are kept FP by the adapters' own rules, not by globs


@dataclass(frozen=True)
class QuantConfig:
    """Which sites are quantized and how.

    `weights=None` keeps weights in floating point; `activations=None` keeps
    activations in floating point. `groups=None` means every group the model
    adapter knows (ESMFold: `esm`, `trunk`, `structure`). `include` and
    `exclude` are module-name globs (`fnmatch`) applied after kinds/groups.
    `quantize_heads` also quantizes the parts kept in floating point by
    default (LM head, contact regression, distogram/pLDDT/pTM heads).
    `special_tokens` says how the LM's BOS/EOS positions are handled at
    activation sites (`SpecialTokens`; default `float`: they stay in
    floating point, two rows per sequence).
    `study` set (and only then) makes this a study-exact recipe: quantizers of
    `Scheme.STUDY_*`, the study's calibration and W8 (`StudyOptions`).
    `pair_bits=8` holds ESMFold's pair activations in int8 while it folds
    (`ptq_protein.nn.pair_int8`); None keeps them in floating point.
    `trunk_dtype="bfloat16"` holds the Linear weights of ESMFold's trunk pair operations in bfloat16 and runs
    their products in it (`ptq_protein.nn.trunk_dtype`); None keeps the trunk in the model's dtype.
    `rotate_ffn=b` (0: off) rotates ESM C's SwiGLU products by Hadamard blocks of `b` channels first.
    `activations_at` holds `(glob, TensorQuant)` pairs: an activation site whose module name matches a glob takes
    that quantizer instead of `activations` (the first match wins), e.g. dynamic per-token rows where LayerNorm
    outputs enter and static per-tensor ranges elsewhere (`activation_for` says which).
    """

    weights: Optional[TensorQuant] = TensorQuant(bits=8, granularity=Granularity.PER_CHANNEL)
    activations: Optional[TensorQuant] = TensorQuant(bits=8)
    kinds: Tuple[SiteKind, ...] = (SiteKind.LINEAR, SiteKind.LAYERNORM)
    groups: Optional[Tuple[str, ...]] = None
    include: Tuple[str, ...] = ()
    exclude: Tuple[str, ...] = _DEFAULT_EXCLUDE
    quantize_heads: bool = False
    backend: Backend = Backend.FAKE
    smoothquant: Optional[SmoothQuantSpec] = None
    gptq: Optional[GPTQSpec] = None
    special_tokens: SpecialTokens = SpecialTokens.FLOAT
    name: str = "custom"
    study: Optional[StudyOptions] = None
    pair_bits: Optional[int] = None
    trunk_dtype: Optional[str] = None
    rotate_ffn: int = 0
    activations_at: Tuple[Tuple[str, TensorQuant], ...] = ()
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", tuple(as_choice(SiteKind, k) for k in self.kinds))
        object.__setattr__(self, "backend", as_choice(Backend, self.backend))
        object.__setattr__(self, "special_tokens", as_choice(SpecialTokens, self.special_tokens))
        for name in ("include", "exclude"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(value))
        if self.groups is not None:
            groups = (self.groups,) if isinstance(self.groups, str) else tuple(self.groups)
            object.__setattr__(self, "groups", groups)
        for name in ("weights", "activations"):
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, TensorQuant.from_dict(value))
            elif value is not None and not isinstance(value, TensorQuant):
                raise TypeError(f"{name} must be a TensorQuant, a dict or None, got {type(value).__name__}")
        for name, cls in (("smoothquant", SmoothQuantSpec), ("gptq", GPTQSpec)):
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, cls.from_dict(value))
            elif value is not None and not isinstance(value, cls):
                raise TypeError(f"{name} must be a {cls.__name__}, a dict or None, got {type(value).__name__}")
        if self.gptq is not None and (self.weights is None or self.weights.scheme is not Scheme.UNIFORM
                                      or not self.weights.symmetric
                                      or self.weights.granularity is not Granularity.PER_CHANNEL):
            raise ValueError("gptq needs symmetric per-channel uniform weights (weights=TensorQuant(bits=4 or 8, "
                             "granularity='per_channel', symmetric=True)); drop gptq or change the weights")
        if self.weights is not None and (self.weights.dynamic or self.weights.granularity is Granularity.PER_TOKEN):
            raise ValueError("weights are quantized once from their own values: use per_tensor or per_channel, not "
                             "dynamic/per_token")
        self._check_activations_at()
        fp8 = [n for n, spec in self._specs() if spec.scheme is Scheme.FP8]
        if self.backend is Backend.INT8 and any(spec.granularity is Granularity.PER_CHANNEL
                                                for n, spec in self._specs() if n != "weights"):
            raise ValueError("backend 'int8' cannot run per-channel activation scales (a scale along the summed "
                             "dimension does not factor out of an integer GEMM); use backend='fake', or per_tensor / "
                             "per_token activations")
        if self.backend is Backend.INT8 and fp8:
            raise ValueError(f"backend 'int8' runs integer codes, but the {' and '.join(fp8)} of recipe {self.name!r} "
                             "are FP8; run FP8 with backend='fake' (exact float8 simulation)")
        self._check_study()
        self._check_int8()
        check_rotation_block(self.rotate_ffn, study=self.study is not None)
        check_fold_execution(self.pair_bits, self.trunk_dtype)
        if self.version != CONFIG_VERSION:
            raise ValueError(f"config version {self.version} is not supported (this is version {CONFIG_VERSION}); "
                             "re-quantize with this release")

    def _check_activations_at(self) -> None:
        pairs = []
        for pair in self.activations_at:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], str):
                raise TypeError("activations_at holds (glob, TensorQuant) pairs, e.g. "
                                "(('*.fc1', TensorQuant(bits=8, granularity='per_token', dynamic=True)),)")
            glob, spec = pair
            spec = TensorQuant.from_dict(spec) if isinstance(spec, dict) else spec
            if not isinstance(spec, TensorQuant):
                raise TypeError(f"activations_at[{glob!r}] must be a TensorQuant or a dict, got {type(spec).__name__}")
            pairs.append((glob, spec))
        object.__setattr__(self, "activations_at", tuple(pairs))
        if pairs and (self.activations is None or self.study is not None):
            raise ValueError("activations_at changes the quantizer of some activation sites: it needs activations= "
                             "for the others, and no study= (the study quantizes every site alike)")

    def _specs(self):
        """(label, spec) of every quantizer spec this config names."""
        named = [("weights", self.weights), ("activations", self.activations)]
        named += [(f"activations_at[{glob!r}]", spec) for glob, spec in self.activations_at]
        return [(label, spec) for label, spec in named if spec is not None]

    def activation_for(self, site: str) -> Optional[TensorQuant]:
        """The activation quantizer of the site named ``site`` (``activations_at``'s first matching glob, else
        ``activations``)."""
        for glob, spec in self.activations_at:
            if fnmatch.fnmatchcase(site, glob):
                return spec
        return self.activations

    def _check_study(self) -> None:
        if isinstance(self.study, dict):
            object.__setattr__(self, "study", StudyOptions.from_dict(self.study))
        specs = [s for s in (self.weights, self.activations) if s is not None]
        if self.study is None:
            if any(s.is_study for s in specs):
                raise ValueError("the study's schemes need study=StudyOptions() (the study's calibration and W8); "
                                 "or use a study-* preset")
            return
        if not all(s.is_study for s in specs):
            raise ValueError("a study config quantizes with the study's schemes only: set weights/activations to "
                             "scheme 'study_uniform' / 'study_pwlq' (or None), or drop study=")
        if self.activations is not None and self.activations.range_method is not RangeMethod.STUDY_TOPK:
            raise ValueError("study activations take their range from range_method='study_topk'")
        if self.weights is not None and (self.weights.scheme is not Scheme.STUDY_UNIFORM
                                         or self.weights.granularity is not Granularity.PER_CHANNEL):
            raise ValueError("the study's weights are scheme 'study_uniform', per_channel (per row; 1-D per tensor)")
        if self.backend is not Backend.FAKE:
            raise ValueError("study-* recipes simulate in float (backend 'fake'), as the study did")

    def _check_int8(self) -> None:
        """backend 'int8' runs integer GEMMs on codes of at most 8 bits and uniform weights: refused when built."""
        if self.backend is not Backend.INT8:
            return
        for label, spec in self._specs():
            if spec.bits > 8:
                raise ValueError(f"backend 'int8' runs at most 8-bit codes but {label} are {spec.bits}-bit; "
                                 "use backend='fake'")
        if self.weights is not None and self.weights.scheme is not Scheme.UNIFORM:
            raise ValueError("backend 'int8' needs uniform weights (piecewise-linear weights run with backend='fake')")

    def replace(self, **changes: Any) -> "QuantConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "weights": None if self.weights is None else self.weights.to_dict(),
            "activations": None if self.activations is None else self.activations.to_dict(),
            "kinds": [k.value for k in self.kinds],
            "groups": None if self.groups is None else list(self.groups),
            "include": list(self.include),
            "exclude": list(self.exclude),
            "quantize_heads": self.quantize_heads,
            "backend": self.backend.value,
            "smoothquant": None if self.smoothquant is None else self.smoothquant.to_dict(),
            "gptq": None if self.gptq is None else self.gptq.to_dict(),
            "special_tokens": self.special_tokens.value,
            **({} if self.study is None else {"study": self.study.to_dict()}),
            **({} if self.pair_bits is None else {"pair_bits": self.pair_bits}),  # absent: float pairs, as before
            **({} if self.trunk_dtype is None else {"trunk_dtype": self.trunk_dtype}),  # absent: as before
            **({"rotate_ffn": self.rotate_ffn} if self.rotate_ffn else {}),  # absent: no rotation, as before
            **({"activations_at": [[glob, spec.to_dict()] for glob, spec in self.activations_at]}
               if self.activations_at else {}),  # absent: one quantizer for every site, as before
        }

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "QuantConfig":
        """Inverse of :meth:`to_dict`. A dict without ``special_tokens`` (an artifact
        made before the option existed) means ``clip``, the behaviour it was made with."""
        data = dict(data)
        data.setdefault("special_tokens", SpecialTokens.CLIP.value)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown config fields {sorted(unknown)}; known: {sorted(known)}")
        for key in ("kinds", "include", "exclude", "activations_at"):
            if key in data and isinstance(data[key], list):
                data[key] = tuple(tuple(v) if isinstance(v, list) else v for v in data[key])
        if data.get("groups") is not None:
            data["groups"] = tuple(data["groups"])
        return cls(**data)

    def describe(self) -> str:
        w = "FP" if self.weights is None else self.weights.describe()
        w += " (GPTQ)" if self.gptq is not None else ""
        a = "FP" if self.activations is None else self.activations.describe()
        at: Dict[str, list] = {}
        for glob, spec in self.activations_at:
            at.setdefault(spec.describe(), []).append(glob)
        a += "".join(f"; {label} at {', '.join(globs)}" for label, globs in at.items())
        a += f" (SmoothQuant alpha={self.smoothquant.alpha})" if self.smoothquant is not None else ""
        special = f"; BOS/EOS {self.special_tokens.value}" if self.activations is not None else ""
        pair = "" if self.pair_bits is None else f"; pair activations int{self.pair_bits}"
        pair += "" if self.trunk_dtype is None else f"; trunk pair operations {self.trunk_dtype}"
        pair += f"; SwiGLU product Hadamard-rotated (block {self.rotate_ffn})" if self.rotate_ffn else ""
        kinds = ",".join(k.value for k in self.kinds)
        return f"{self.name}: weights {w}; activations {a}; sites {kinds}{special}{pair}"
