"""Calibrate once, then quantize any subset of sites at any precision by module swap alone.

:class:`Workbench` deep-copies the caller's model once, calibrates every site in
scope once, and caches each (site, activation spec) quantizer the first time it
is asked for. :meth:`Workbench.applied` swaps the chosen sites' modules in, yields
the model, and puts the FP modules back in ``finally``: a sensitivity run or a
search candidate costs forwards, never another calibration.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ptq_protein.api import CalibrationInfo, QuantState, calibration_sequences
from ptq_protein.calibration.sites import Site, discover_sites, select_sites, set_module
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.fused_float import use_fast_float_if_integer_
from ptq_protein.nn.convert import build_quant_linear
from ptq_protein.nn.modules import ActQuantizer, QuantInput, QuantLinear
from ptq_protein.nn.qparams import activation_quantizer, needs_calibration
from ptq_protein.nn.special_tokens import keep_special_tokens_float_
from ptq_protein.passes.forwards import run_forwards
from ptq_protein.passes.site_report import build_report
from ptq_protein.quant.metrics import sqnr_db
from ptq_protein.recipes.config import Backend, QuantConfig, RangeMethod, SiteKind, SpecialTokens, TensorQuant
from ptq_protein.support.errors import InputError

__all__ = ["Workbench", "SiteSpec"]

log = logging.getLogger(__name__)

SiteSpec = Tuple[Optional[TensorQuant], Optional[TensorQuant]]  # (weights, activations); None = FP
# Calibrating with a top-k spec makes every observer exist (min/max, histogram, moments, top-k),
# so the same statistics serve PWLQ (min-max range) and uniform (top-k median) activations.
_CALIB_SPEC = TensorQuant(bits=8, range_method=RangeMethod.TOPK)
_KINDS = (SiteKind.LINEAR, SiteKind.LAYERNORM)


class Workbench:
    """The caller's model (copied), its sites in ``scope`` and their calibration statistics.

    Parameters
    ----------
    model : an ESM-2 / ESMFold model (left untouched).
    scope : which sites may be quantized (kinds, groups, globs); MATMUL sites are not supported here.
    calibration : as for :func:`ptq_protein.quantize`.
    """

    def __init__(self, model: nn.Module, scope: QuantConfig, calibration, *, batch_size: Optional[int] = None,
                 num_recycles: Optional[int] = None, calib_max_length: Optional[int] = None,
                 backend: Backend = Backend.FAKE, calib_spec: Optional[TensorQuant] = None):
        if SiteKind.MATMUL in scope.kinds:
            raise InputError(f"recipe {scope.name!r} quantizes attention/triangle matmul operands, which sensitivity "
                             "and --auto do not split into units yet; use a recipe on linear and layernorm sites "
                             "(e.g. w8a8-pwlq)")
        if scope.rotate_ffn:  # measured on the unrotated copy, it would rank another model than the recipe's
            raise InputError(f"recipe {scope.name!r} rotates ESM C's SwiGLU products first (rotate_ffn), which "
                             "sensitivity and --auto do not do: rank with the recipe without it (e.g. w8a8-dynamic), "
                             "or rotate the float model first (ptq_protein.transforms.rotation.rotate_ffn_product_)")
        self.adapter = get_adapter(model)
        self.model = copy.deepcopy(model).eval()
        self.adapter.prepare(self.model)
        self.scope, self.backend = scope, Backend(backend)
        self.sites: List[Site] = [s for s in select_sites(discover_sites(self.model, self.adapter), scope)
                                  if s.kind in _KINDS]
        if not self.sites:
            raise InputError(f"recipe {scope.name!r} selects no linear or layernorm site of this model")
        self.forward_kwargs = {"num_recycles": num_recycles} if num_recycles is not None else {}
        self.stats, self.calibration = self._calibrate(calibration, batch_size, calib_max_length,
                                                       calib_spec or _CALIB_SPEC)
        self._originals = {s.name: self.model.get_submodule(s.name) for s in self.sites}
        # BOS/EOS rows as the recipe says (pp.quantize's default keeps them in float): one context for the
        # working model, pointed at by every quantizer swapped in (build() deep-copies both together)
        self._special = (keep_special_tokens_float_(self.model, self.adapter)
                         if scope.special_tokens is SpecialTokens.FLOAT else None)
        self._quants: Dict[Tuple[str, TensorQuant], Optional[ActQuantizer]] = {}
        self._configs: Dict[Optional[TensorQuant], QuantConfig] = {}

    @torch.no_grad()
    def _calibrate(self, calibration, batch_size: Optional[int], max_length: Optional[int], spec: TensorQuant):
        name, seqs = calibration_sequences(self.adapter, calibration, max_length)
        stats, _ = run_forwards(self.model, self.adapter, seqs, sites=self.sites,
                                specs={s.name: spec for s in self.sites}, batch_size=batch_size,
                                forward_kwargs=self.forward_kwargs)
        return stats, CalibrationInfo.for_sequences(name, seqs)

    # -- quantizers ----------------------------------------------------------------------
    def act_quantizer(self, site: str, spec: TensorQuant) -> Optional[ActQuantizer]:
        """The cached quantizer of ``site`` under ``spec`` (None: the site never saw a residue)."""
        key = (site, spec)
        if key not in self._quants:
            stats = self.stats.get(site)
            if needs_calibration(spec) and (stats is None or stats.count == 0):
                log.warning("site %s never saw a residue during calibration: its input stays in floating point", site)
                self._quants[key] = None
            else:
                self._quants[key] = activation_quantizer(spec, stats)
        return self._quants[key]

    def weight_numel(self) -> Dict[str, int]:
        return {s.name: self._originals[s.name].weight.numel() for s in self.sites if s.kind is SiteKind.LINEAR}

    def _config(self, weights: Optional[TensorQuant]) -> QuantConfig:
        if weights not in self._configs:
            self._configs[weights] = QuantConfig(weights=weights, activations=None, kinds=(), backend=self.backend)
        return self._configs[weights]

    @torch.no_grad()
    def _swap(self, model: nn.Module, specs: Dict[str, SiteSpec]) -> Dict[str, str]:
        done: Dict[str, str] = {}
        kinds = {s.name: s.kind for s in self.sites}
        for name, (wspec, aspec) in specs.items():
            if name not in kinds:
                raise KeyError(f"{name} is not a site in scope")
            original = self._originals[name]
            quant = None if aspec is None else self.act_quantizer(name, aspec)
            device = next(iter(original.parameters()), torch.empty(0)).device
            quant = None if quant is None else quant.to(device)
            if kinds[name] is SiteKind.LINEAR and (wspec is not None or quant is not None):
                set_module(model, name, build_quant_linear(original, self._config(wspec), quant).to(device))
                done[name] = "linear" + (" W" if wspec is not None else "") + (" A" if quant is not None else "")
            elif kinds[name] is SiteKind.LAYERNORM and quant is not None:
                set_module(model, name, QuantInput(original, quant))
                done[name] = "layernorm input"
        return done

    @contextlib.contextmanager
    def applied(self, specs: Dict[str, SiteSpec]) -> Iterator[nn.Module]:
        """The working model with ``specs`` swapped in; every FP module is restored afterwards."""
        try:
            self._last_done = self._swap(self.model, specs)
            if self._special is not None:
                for module in self.model.modules():
                    if isinstance(module, ActQuantizer):
                        module.special_tokens = self._special
            yield self.model
        finally:
            for name in specs:
                set_module(self.model, name, self._originals[name])

    def build(self, specs: Dict[str, SiteSpec], config: QuantConfig, plan=None) -> nn.Module:
        """A standalone quantized model (deep copy) with ``specs`` applied and its ``ptq_state`` filled in."""
        with self.applied(specs) as working:
            qmodel, done = copy.deepcopy(working), self._last_done
        chosen = [s for s in self.sites if s.name in done]
        quants = {n: q for n, (_, a) in specs.items() if a is not None and (q := self.act_quantizer(n, a)) is not None}
        sqnr = {n: sqnr_db(self._originals[n].weight.detach(),
                           qmodel.get_submodule(n).dequantized_weight(torch.float32))
                for n in done if n in self.weight_numel() and isinstance(qmodel.get_submodule(n), QuantLinear)
                and qmodel.get_submodule(n).weight_spec is not None}
        report = build_report(qmodel, chosen, self.stats, quants, config, sqnr)
        for row in report:
            if plan is not None and row["site"] in plan.site_choices():
                row["choice"] = plan.site_choices()[row["site"]].name
        qmodel.ptq_state = QuantState(config, self.adapter.family, chosen, done, self.calibration, report, [], {},
                                      plan=plan)
        use_fast_float_if_integer_(qmodel)  # as pp.quantize does
        return qmodel

    def recipe_specs(self, config: QuantConfig, names: Sequence[str]) -> Dict[str, SiteSpec]:
        """The (weights, activations) that ``config`` gives each of ``names``."""
        kinds = {s.name: s.kind for s in self.sites}
        return {n: (config.weights if kinds[n] is SiteKind.LINEAR else None, config.activation_for(n)) for n in names}
