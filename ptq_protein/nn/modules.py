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

from typing import Any, Callable, Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from ptq_protein.nn.fused import fused_call, padded_regions, piecewise_fake, uniform_fake
from ptq_protein.nn.row_ops import restore_rows, row_slice
from ptq_protein.quant.codebook import PiecewiseCodebook, pwlq_dequantize, pwlq_quantize
from ptq_protein.quant.fit import pwlq_codebook_for_values
from ptq_protein.quant.fp8 import fp8_dequantize, fp8_fake_quantize, fp8_per_token, fp8_quantize, fp8_scale
from ptq_protein.quant.uniform import choose_qparams, code_dtype, dequantize, dynamic_per_token, qrange, quantize
from ptq_protein.recipes.config import Backend, Engine, Granularity, Scheme, TensorQuant

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
    Static PWLQ: a :class:`PiecewiseCodebook`. Static FP8: ``scale`` (zero point 0).
    Dynamic: parameters from each tensor.
    """

    def __init__(self, spec: TensorQuant, scale: Optional[torch.Tensor] = None,
                 zero_point: Optional[torch.Tensor] = None, codebook: Optional[PiecewiseCodebook] = None):
        super().__init__()
        self.spec = spec
        self.codebook = codebook
        if spec.scheme in (Scheme.UNIFORM, Scheme.FP8) and not spec.dynamic:
            if scale is None or zero_point is None:
                raise ValueError(f"a static {spec.scheme.value} activation quantizer needs scale and zero_point")
            self.register_buffer("scale", scale.detach().to(torch.float32).clone())
            self.register_buffer("zero_point", zero_point.detach().to(torch.int32).clone())
        if spec.scheme is Scheme.PWLQ and not spec.runtime_breakpoints and codebook is None:
            raise ValueError("a static piecewise-linear activation quantizer needs a codebook")
        # Set by nn.special_tokens.keep_special_tokens_float_ (plain attributes, not state):
        # rows at BOS/EOS positions of the running forward bypass the quantizer.
        self.special_tokens = None
        self.channel_last = True

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
        if spec.scheme is Scheme.FP8:
            return self._encode_fp8(x)
        if not spec.dynamic:
            return quantize(x, self.scale, self.zero_point, spec.bits, spec.symmetric), \
                ("uniform", self.scale, self.zero_point)
        if spec.granularity is Granularity.PER_TOKEN:
            codes, scale, zp = dynamic_per_token(x, spec.bits, spec.symmetric)
            return codes, ("uniform", scale, zp)
        lo, hi = torch.aminmax(x.detach().float())
        scale, zp = choose_qparams(lo, hi, spec.bits, spec.symmetric)
        return quantize(x, scale, zp, spec.bits, spec.symmetric), ("uniform", scale, zp)

    def _encode_fp8(self, x: torch.Tensor):
        """FP8 codes (a ``torch.float8_*`` tensor) and ``("fp8", scale)``."""
        fmt = self.spec.fp8_format
        if not self.spec.dynamic:
            return fp8_quantize(x, self.scale, fmt), ("fp8", self.scale)
        if self.spec.granularity is Granularity.PER_TOKEN:
            codes, scale = fp8_per_token(x, fmt)
            return codes, ("fp8", scale)
        finite = x.detach().float().nan_to_num(0.0, posinf=0.0, neginf=0.0)
        scale = fp8_scale(finite.abs().amax(), fmt)
        return fp8_quantize(x, scale, fmt), ("fp8", scale)

    @staticmethod
    def decode(codes: torch.Tensor, params) -> torch.Tensor:
        if params[0] == "pwlq":
            return pwlq_dequantize(codes, params[1])
        if params[0] == "fp8":
            return fp8_dequantize(codes, params[1])
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
        if self.spec.scheme is Scheme.FP8:  # the float8 cast is the rounding: nothing to fuse
            return fp8_fake_quantize(x, self.scale, self.spec.fp8_format)
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

    def special_rows(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Bool mask broadcastable to ``x``, True where x stays in floating point (BOS/EOS), or None."""
        context = self.special_tokens
        return None if context is None else context.rows(x, self.channel_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fake quantization: the values the integer path decodes, in x's dtype; NaN propagates.

        Rows at BOS/EOS positions (:meth:`special_rows`) are returned unchanged.
        """
        if self.is_static and x.is_floating_point():
            out = self._fake_static(x)
        else:
            codes, params = self.encode(x)
            out = self.decode(codes, params)
            out = torch.where(torch.isnan(x), x.to(out.dtype), out).to(x.dtype)
        keep = self.special_rows(x)
        return out if keep is None else restore_rows(x, out, keep)

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
    two per byte in artifacts and for the W4A8 kernel), or ``torch.float8_*`` for
    FP8 weights; ``weight_scale`` [N] f32.
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
            # int8 up to 8 bits, int16 above (int8 would wrap a 12-bit code silently)
            code_type = weight_codes.dtype if weight_spec.scheme is Scheme.FP8 else code_dtype(weight_spec.bits)
            self.register_buffer("weight_codes", weight_codes.detach().to(code_type).clone())
            if weight_codebook is None:
                self.register_buffer("weight_scale", weight_scale.detach().to(torch.float32).reshape(-1, 1).clone())
                self.register_buffer("weight_zero_point",
                                     weight_zero_point.detach().to(torch.int32).reshape(-1, 1).clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.input_quant = input_quant
        self._dequantized: Optional[torch.Tensor] = None
        self._int_cache: Dict[str, Any] = {}
        self._restore_codes: Optional[Callable[[], torch.Tensor]] = None
        self.engine = Engine.AUTO  # which integer GEMM backend="int8" runs (nn.int_exec)
        self.engine_ran: Optional[str] = None

    # -- plain codes vs the prepacked copy (nn.int_fast) ------------------------------
    def plain_weight_codes(self) -> torch.Tensor:
        """Int8 weight codes ``[N, K]``, unpacked from the prepacked copy when the plain one was released."""
        return self.weight_codes if self._restore_codes is None else self._restore_codes()

    def release_weight_codes(self, restore: Callable[[], torch.Tensor]) -> None:
        """Drop the plain codes (a prepacked copy holds them); ``restore()`` rebuilds them on demand."""
        n, k = self.weight_codes.shape
        self.weight_codes = torch.zeros((), dtype=self.weight_codes.dtype, device=self.weight_codes.device).expand(n, k)
        self._restore_codes = restore

    def _keep_plain_codes(self) -> None:
        """Bring the plain codes back and forget the prepacked copy (before moves and loads)."""
        if self._restore_codes is not None:
            self.weight_codes = self._restore_codes()
            self._restore_codes = None
        self._int_cache = {}

    def __getstate__(self):  # copy.deepcopy / pickle: plain codes, no prepacked copy
        state = super().__getstate__().copy()
        if self._restore_codes is not None:
            state["_buffers"] = dict(state["_buffers"], weight_codes=self._restore_codes())
        state.update(_restore_codes=None, _int_cache={}, _dequantized=None)
        return state

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._restore_codes is not None:
            destination[prefix + "weight_codes"] = self._restore_codes()

    def _load_from_state_dict(self, *args, **kwargs):
        self._keep_plain_codes()
        self._dequantized = None
        return super()._load_from_state_dict(*args, **kwargs)

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
        w = self._decode(self.plain_weight_codes(), getattr(self, "weight_scale", None),
                         getattr(self, "weight_zero_point", None)).to(dtype)
        self._dequantized = w if self.cache_dequantized else None
        return w

    def dequantized_rows(self, start: int, stop: int) -> torch.Tensor:
        """float32 rows ``start:stop`` of :meth:`dequantized_weight`, the same values, decoded from those rows only."""
        if self.weight_spec is None:
            return self.weight[start:stop].float()
        return self._decode(self.plain_weight_codes()[start:stop],
                            row_slice(getattr(self, "weight_scale", None), start, stop),
                            row_slice(getattr(self, "weight_zero_point", None), start, stop))

    def _decode(self, codes: torch.Tensor, scale: Optional[torch.Tensor],
                zero_point: Optional[torch.Tensor]) -> torch.Tensor:
        if self.weight_codebook is not None:
            return pwlq_dequantize(codes, self.weight_codebook)
        if self.weight_spec.scheme is Scheme.FP8:
            return fp8_dequantize(codes, scale)
        if self.symmetric_weight_codes():  # one pass, the same float32 values as (codes - 0) * scale
            return torch.mul(codes, scale)
        return dequantize(codes, scale, zero_point)

    def symmetric_weight_codes(self) -> bool:
        """Uniform int8 weight codes whose zero points are all 0 (cached until a move or a state-dict load)."""
        cache = self._int_cache
        if "symmetric" not in cache:
            zero = getattr(self, "weight_zero_point", None)
            cache["symmetric"] = (self.weight_codebook is None and zero is not None
                                  and self.weight_codes.dtype == torch.int8 and not bool((zero != 0).any()))
        return cache["symmetric"]

    def _apply(self, fn, recurse=True):  # device/dtype moves invalidate the caches
        self._dequantized = None
        self._keep_plain_codes()
        return _apply_keeping_float32(self, ("weight_scale", "weight_codes"), fn, recurse)  # FP8 codes stay FP8

    # -- forward ---------------------------------------------------------------------
    @staticmethod
    def encoder_layer_runner():
        """The fused integer encoder layer (:mod:`ptq_protein.nn.layer_int8`), offered to the architecture code
        (``models/encoder_roles``), which sits below this package layer and cannot import it."""
        from ptq_protein.nn import layer_int8

        return layer_int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend is Backend.INT8 and self.input_quant is not None and self.weight_spec is not None:
            from ptq_protein.nn.int_shared import int_forward

            return int_forward(self, x)
        xq = x if self.input_quant is None else self.input_quant(x)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        weight = self.dequantized_weight(x.dtype)
        return self._float_rows(x, F.linear(xq, weight, bias), lambda rows: F.linear(rows, weight, bias))

    def _float_rows(self, x: torch.Tensor, y: torch.Tensor,
                    product: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``y`` with its BOS/EOS rows replaced by ``product`` of ``x``'s rows (see ActQuantizer.special_rows).

        ``product`` is the backend's float GEMM of the weight the codes stand for
        (the fake backend reuses its dequantized weight; the integer backend reads
        the int8 codes, :func:`~ptq_protein.nn.int_exec.float_rows_linear`), run on
        those few rows only (a GEMM over a subset of rows may round differently
        from the full one).
        """
        keep = None if self.input_quant is None else self.input_quant.special_rows(x)
        if keep is None:
            return y
        index = keep.expand(*x.shape[:-1], 1).reshape(-1).nonzero().flatten()
        flat = y.reshape(-1, y.shape[-1])
        flat.index_copy_(0, index, product(x.reshape(-1, x.shape[-1]).index_select(0, index)).to(y.dtype))
        return flat.reshape(y.shape)

    def extra_repr(self) -> str:
        w = "fp" if self.weight_spec is None else self.weight_spec.describe()
        return (f"in_features={self.in_features}, out_features={self.out_features}, weight={w}, "
                f"backend={self.backend.value}")


class QuantInput(nn.Module):
    """Quantize the first input of ``module`` (a LayerNorm or Softmax, or any module in ``study-*`` recipes)."""

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
