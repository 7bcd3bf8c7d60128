"""Quantized modules: thin wrappers that hold parameters and call the math.

* :class:`ActQuantizer` — one activation site's quantizer (uniform static or
  dynamic, piecewise-linear static or with run-time breakpoints).
* :class:`QuantLinear` — integer weight codes + optional input quantizer;
  ``backend="fake"`` simulates in float, ``backend="int8"`` runs integer GEMMs.
* :class:`QuantInput` — quantizes the first input of a wrapped module (LayerNorm).

Weights are *copied* into the quantized modules; the caller's float model is
never modified.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from ptq_protein.config import Backend, Granularity, Scheme, TensorQuant
from ptq_protein.nn.fused import fused_call, padded_regions, piecewise_fake, uniform_fake
from ptq_protein.quant.codebook import PiecewiseCodebook, pwlq_dequantize, pwlq_quantize
from ptq_protein.quant.fit import pwlq_codebook_for_values
from ptq_protein.quant.uniform import choose_qparams, dequantize, dynamic_per_token, qrange, quantize

__all__ = ["ActQuantizer", "QuantLinear", "QuantInput"]


def _apply_keeping_float32(module: nn.Module, names: tuple, fn, recurse: bool):
    """``nn.Module._apply`` that moves the float32 buffers ``names`` but keeps their dtype.

    Quantization parameters are part of the recipe: ``qmodel.to(torch.bfloat16)``
    must change the compute dtype, not round the scales to bf16.
    """
    kept = {n: getattr(module, n) for n in names if getattr(module, n, None) is not None}
    out = nn.Module._apply(module, fn, recurse)
    for n, old in kept.items():
        setattr(module, n, old.to(device=getattr(module, n).device))
    return out


class ActQuantizer(nn.Module):
    """Quantizer of one activation site.

    Static uniform: ``scale``/``zero_point`` buffers (scalar, or [C] per channel).
    Static PWLQ: a :class:`PiecewiseCodebook`. Dynamic: parameters from each tensor.
    """

    def __init__(self, spec: TensorQuant, scale: Optional[torch.Tensor] = None,
                 zero_point: Optional[torch.Tensor] = None, codebook: Optional[PiecewiseCodebook] = None):
        super().__init__()
        self.spec = spec
        self.codebook = codebook
        if spec.scheme is Scheme.UNIFORM and not spec.dynamic:
            if scale is None or zero_point is None:
                raise ValueError("a static uniform activation quantizer needs scale and zero_point")
            self.register_buffer("scale", scale.detach().to(torch.float32).clone())
            self.register_buffer("zero_point", zero_point.detach().to(torch.int32).clone())
        if spec.scheme is Scheme.PWLQ and not spec.runtime_breakpoints and codebook is None:
            raise ValueError("a static piecewise-linear activation quantizer needs a codebook")

    def _apply(self, fn, recurse=True):
        self._table = None
        return _apply_keeping_float32(self, ("scale",), fn, recurse)

    @property
    def is_static(self) -> bool:
        if self.spec.scheme is Scheme.PWLQ:
            return not self.spec.runtime_breakpoints
        return not self.spec.dynamic

    def _dynamic_codebook(self, x: torch.Tensor) -> PiecewiseCodebook:
        return pwlq_codebook_for_values(x.detach().reshape(-1), self.spec)

    def encode(self, x: torch.Tensor):
        """Integer codes of ``x`` plus the parameters that decode them.

        Returns ``(codes, params)`` where params is ``("uniform", scale, zero_point)``
        (broadcastable to x) or ``("pwlq", codebook)``.
        """
        spec = self.spec
        if spec.scheme is Scheme.PWLQ:
            cb = self.codebook if self.is_static else self._dynamic_codebook(x)
            return pwlq_quantize(x, cb), ("pwlq", cb)
        if not spec.dynamic:
            return quantize(x, self.scale, self.zero_point, spec.bits, spec.symmetric), \
                ("uniform", self.scale, self.zero_point)
        if spec.granularity is Granularity.PER_TOKEN:
            codes, scale, zp = dynamic_per_token(x, spec.bits, spec.symmetric)
            return codes, ("uniform", scale, zp)
        lo, hi = torch.aminmax(x.detach().float())
        scale, zp = choose_qparams(lo, hi, spec.bits, spec.symmetric)
        return quantize(x, scale, zp, spec.bits, spec.symmetric), ("uniform", scale, zp)

    @staticmethod
    def decode(codes: torch.Tensor, params) -> torch.Tensor:
        if params[0] == "pwlq":
            return pwlq_dequantize(codes, params[1])
        return dequantize(codes, params[1], params[2])

    def _region_table(self, device: torch.device):
        """(thresholds [R-1], table [R, 4] of offset, scale, code_lo, code_hi), R padded to a power of two."""
        cached = getattr(self, "_table", None)
        if cached is None or cached[0].device != device:
            cb = self.codebook
            table = torch.stack([cb.offsets(device), cb.scales(device), cb.code_lo_tensor(device).float(),
                                 cb.code_hi_tensor(device).float()], dim=1)
            cached = padded_regions(cb.thresholds_tensor(device), table)  # the compiled path's one graph per size
            self._table = cached
        return cached

    def _fake_static(self, x: torch.Tensor) -> torch.Tensor:
        """Fake quantization in float32 arithmetic, equal bit for bit to decode(encode(x)).

        The codes are small integers, so computing them and their decoded values
        in float32 (without the integer round trip and NaN bookkeeping) is exact;
        NaN propagates through round/clamp by itself. Large tensors go through one
        fused compiled loop (:mod:`ptq_protein.nn.fused`), small ones run eagerly.
        """
        xf = x if x.dtype == torch.float64 else x.to(torch.float32)
        if self.spec.scheme is Scheme.PWLQ:
            thresholds, table = self._region_table(xf.device)
            out = fused_call(piecewise_fake, xf, thresholds.to(xf.dtype), table, eager=self._fake_pwlq)
            return out.to(x.dtype)
        qmin, qmax = qrange(self.spec.bits, self.spec.symmetric)
        return fused_call(uniform_fake, xf, self.scale, self.zero_point, qmin, qmax,
                          channels=self.scale.dim() > 0).to(x.dtype)

    @staticmethod
    def _fake_pwlq(xf: torch.Tensor, thresholds: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Eager PWLQ fake quantization: a gather beats :func:`piecewise_fake`'s where chain when not compiled."""
        region = torch.zeros(xf.shape, dtype=torch.long, device=xf.device)
        for t in thresholds:  # R <= 8: a few comparisons beat searchsorted
            region += xf >= t
        off, sc, lo, hi = table[region].unbind(-1)  # one gather of all four region parameters
        q = torch.minimum(torch.maximum(torch.round((xf - off.to(xf.dtype)) / sc.to(xf.dtype)), lo), hi)
        return off + sc * q.to(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fake quantization: the values the integer path decodes, in x's dtype; NaN propagates."""
        if self.is_static and x.is_floating_point():
            return self._fake_static(x)
        codes, params = self.encode(x)
        out = self.decode(codes, params)
        return torch.where(torch.isnan(x), x.to(out.dtype), out).to(x.dtype)

    def state(self) -> Dict[str, Any]:
        """JSON-able parameters (the tensors are small: scalars or [C])."""
        out: Dict[str, Any] = {"spec": self.spec.to_dict()}
        if self.codebook is not None:
            out["codebook"] = self.codebook.to_dict()
        if hasattr(self, "scale"):
            out["scale"] = self.scale.tolist()
            out["zero_point"] = self.zero_point.tolist()
        return out

    @classmethod
    def from_state(cls, state: Dict[str, Any]) -> "ActQuantizer":
        spec = TensorQuant.from_dict(state["spec"])
        cb = PiecewiseCodebook.from_dict(state["codebook"]) if "codebook" in state else None
        scale = torch.tensor(state["scale"], dtype=torch.float32) if "scale" in state else None
        zp = torch.tensor(state["zero_point"], dtype=torch.int32) if "zero_point" in state else None
        return cls(spec, scale=scale, zero_point=zp, codebook=cb)

    def extra_repr(self) -> str:
        return self.spec.describe()


class QuantLinear(nn.Module):
    """``nn.Linear`` with integer weight codes and an optional input quantizer.

    Weight codes are int8 ``[N, K]`` (4-bit codes are kept unpacked here and packed
    two per byte in artifacts and for the W4A8 kernel); ``weight_scale`` [N] f32.
    """

    def __init__(self, in_features: int, out_features: int, *, weight: Optional[torch.Tensor],
                 weight_codes: Optional[torch.Tensor], weight_scale: Optional[torch.Tensor],
                 weight_zero_point: Optional[torch.Tensor], weight_spec: Optional[TensorQuant],
                 bias: Optional[torch.Tensor], input_quant: Optional[ActQuantizer], backend: Backend = Backend.FAKE,
                 weight_codebook: Optional[PiecewiseCodebook] = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_spec = weight_spec
        self.weight_codebook = weight_codebook
        self.backend = Backend(backend)
        if weight_spec is None:
            self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        else:
            self.register_buffer("weight_codes", weight_codes.detach().to(torch.int8).clone())
            if weight_codebook is None:
                self.register_buffer("weight_scale", weight_scale.detach().to(torch.float32).reshape(-1, 1).clone())
                self.register_buffer("weight_zero_point",
                                     weight_zero_point.detach().to(torch.int32).reshape(-1, 1).clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.input_quant = input_quant
        self._dequantized: Optional[torch.Tensor] = None
        self._int_cache: Dict[str, torch.Tensor] = {}

    # -- weights ---------------------------------------------------------------------
    # A float copy of the weight costs 4 bytes per weight (float32), i.e. 4x the int8
    # codes: keeping one per layer would make a quantized model bigger than its float
    # original. So by default the weight is dequantized on the fly in each forward
    # (one elementwise pass over [N, K], small next to the GEMM with many tokens).
    cache_dequantized: bool = False

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The float weight the codes stand for (fake backend and weight-only sites).

        Recomputed each call unless ``cache_dequantized`` is True on this module
        (see :func:`ptq_protein.nn.convert.cache_dequantized_weights`).
        """
        if self.weight_spec is None:
            return self.weight
        cached = self._dequantized
        if cached is not None and cached.dtype == dtype and cached.device == self.weight_codes.device:
            return cached
        if self.weight_codebook is not None:
            w = pwlq_dequantize(self.weight_codes, self.weight_codebook)
        else:
            w = dequantize(self.weight_codes, self.weight_scale, self.weight_zero_point)
        w = w.to(dtype)
        self._dequantized = w if self.cache_dequantized else None
        return w

    def _apply(self, fn, recurse=True):  # device/dtype moves invalidate the caches
        self._dequantized = None
        self._int_cache = {}
        return _apply_keeping_float32(self, ("weight_scale",), fn, recurse)

    # -- forward ---------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend is Backend.INT8 and self.input_quant is not None and self.weight_spec is not None:
            from ptq_protein.nn.int_exec import int_linear

            return int_linear(self, x)
        if self.input_quant is not None:
            x = self.input_quant(x)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def extra_repr(self) -> str:
        w = "fp" if self.weight_spec is None else self.weight_spec.describe()
        return f"in_features={self.in_features}, out_features={self.out_features}, weight={w}, backend={self.backend.value}"


class QuantInput(nn.Module):
    """Quantize the first input of ``module`` (a LayerNorm: the study's pre-LN activations)."""

    def __init__(self, module: nn.Module, input_quant: ActQuantizer):
        super().__init__()
        self.module = module
        self.input_quant = input_quant

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return self.module(self.input_quant(x), *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:  # parents may read e.g. ``layer_norm.weight`` / ``normalized_shape``
            return getattr(super().__getattr__("module"), name)

