"""``--low-memory``: quantize a fair-esm ESM-2 file layer by layer from its memory-mapped checkpoint.

Peak memory is about the int8 model, one float layer and the calibration set's
residual stream (tokens x width floats); the float model never exists whole.

1. Map the checkpoint (``torch.load(mmap=True)``) and build ``ESM2`` on the meta device.
2. Copy the small parts outside the layers (embeddings, final LayerNorm, heads) into memory.
3. Embed every calibration batch exactly as ``ESM2.forward`` does; keep the residual stream.
4. For each layer: copy its float weights out of the mapping (and hand the mapped pages
   back), run every batch through it with the observers attached, fit its quantizers,
   swap in the quantized modules (the float weights go), keep the layer's outputs as the
   next layer's inputs.
5. The final LayerNorm and the head run on the last residual stream in the same way.

The sequences of the fidelity check (:func:`quantize_streaming_checked`) run through each float
layer before it is swapped: their final outputs are the float model's, as ``quantize --check``
reads them in the default mode.

The stream passed on is the *float* layer's output, as in the default mode's single
float calibration pass, so every site sees the same tensors in the same order and the
artifact equals the default mode's bit for bit (tested). ``propagate="quantized"``
passes the quantized layer's output instead (GPTQ-style sequential calibration: later
layers are calibrated on the activations they will actually see); that artifact
differs from the default mode by design.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ptq_protein.api import CalibrationArg, CalibrationInfo, QuantState
from ptq_protein.calibration.calibrate import collect_stats
from ptq_protein.calibration.sites import discover_sites
from ptq_protein.eval.bench.fidelity import Reference
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.checkpoints import load_torch_checkpoint
from ptq_protein.models.fair_esm2 import esm2_skeleton, fair_esm2_state, fill_missing_regression
from ptq_protein.models.fused_float import use_fast_float_if_integer_
from ptq_protein.models.mapped import MappedFile, trim_heap
from ptq_protein.models.resolve import contact_regression_path
from ptq_protein.nn.convert import swap_modules_
from ptq_protein.nn.special_tokens import apply_special_tokens_
from ptq_protein.passes.fit_activations import fit_activation_quantizers
from ptq_protein.passes.plan import CalibrationPlan, plan_calibration
from ptq_protein.passes.recipe import resolve_recipe
from ptq_protein.passes.sequences import calibration_sequences
from ptq_protein.passes.site_report import build_report
from ptq_protein.recipes.config import QuantConfig
from ptq_protein.recipes.presets import resolve_config
from ptq_protein.support.errors import InputError
from ptq_protein.support.process_memory import computing

__all__ = ["quantize_streaming", "quantize_streaming_checked"]

log = logging.getLogger(__name__)


def quantize_streaming(path: Union[str, Path], config: Union[str, QuantConfig, dict] = "w8a8-pwlq",
                       calibration: CalibrationArg = None, *, batch_size: Optional[int] = None, calib_max_length=None,
                       propagate: str = "fp", allow_pickle: bool = False) -> nn.Module:
    """Quantize the fair-esm ESM-2 checkpoint at ``path`` layer by layer (see the module docstring).

    Returns the same quantized ``ESM2`` (with ``ptq_state``) as ``quantize(load_model(path).model, ...)``.
    """
    return quantize_streaming_checked(path, config, calibration, (), batch_size=batch_size,
                                      calib_max_length=calib_max_length, propagate=propagate,
                                      allow_pickle=allow_pickle)[0]


@torch.no_grad()
def quantize_streaming_checked(path: Union[str, Path], config: Union[str, QuantConfig, dict],
                               calibration: CalibrationArg, check_sequences: Sequence[str], *,
                               batch_size: Optional[int] = None, calib_max_length=None, propagate: str = "fp",
                               allow_pickle: bool = False) -> Tuple[nn.Module, List[Reference]]:
    """:func:`quantize_streaming`, and the float model's outputs on ``check_sequences`` (one at a time, as
    :func:`~ptq_protein.eval.bench.fidelity.reference_outputs` computes them on the whole model): each float
    layer runs them before it is swapped, so the fidelity check of the default mode runs here too.
    """
    if propagate not in ("fp", "quantized"):
        raise ValueError(f"propagate={propagate!r}: use 'fp' (equal to the default mode) or 'quantized'")
    path = Path(path)
    cfg = resolve_config(config)
    recipe = resolve_recipe(cfg)
    data = load_torch_checkpoint(path, allow_pickle=allow_pickle, mmap=True)
    if not (isinstance(data, dict) and isinstance(data.get("cfg"), dict) and "model" in data["cfg"]):
        raise InputError(f"{path}: --low-memory reads fair-esm ESM-2 files (with cfg['model']); "
                         "quantize this model without --low-memory")
    model, _ = esm2_skeleton(data, path)
    state = fair_esm2_state(data, _regression_beside(path, allow_pickle))
    mapped = MappedFile(state.values())
    outer = {k: v.clone() for k, v in state.items() if not k.startswith("layers.")}
    mapped.release(state[k] for k in outer)
    fill_missing_regression(model, outer)
    model.load_state_dict(outer, strict=False, assign=True)
    model.embed_tokens.weight = model.lm_head.weight  # fair-esm's tie (see models.fair_esm2)
    model.eval()
    adapter = get_adapter(model)
    adapter.prepare(model)
    plan = plan_calibration(cfg, recipe.passes, recipe.select(discover_sites(model, adapter), cfg))
    why = recipe.not_streamed(plan)  # the float model is never whole: no transform, no study pass
    if why is not None:
        raise InputError(f"--low-memory streams our calibrate, fit and swap passes only, and recipe {cfg.name!r} "
                         f"needs more ({why}): quantize it without --low-memory")
    name, seqs = calibration_sequences(adapter, calibration, calib_max_length)
    batches = list(adapter.batches(seqs, batch_size))
    streams = [_embed(model, b.inputs["tokens"]) for b in batches]
    checks = [adapter.make_batch([s]) for s in (adapter.validate(list(check_sequences), where="comparison")
                                                 if check_sequences else [])]
    check_streams = [_embed(model, b.inputs["tokens"]) for b in checks]
    run = _Run(model, cfg, plan, batches)
    for i, layer in enumerate(model.layers):
        prefix = f"layers.{i}."
        own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        layer.load_state_dict({k: v.clone() for k, v in own.items()}, strict=True, assign=True)
        mapped.release(own.values())
        step = lambda x, pad, layer=layer: layer(x, self_attn_padding_mask=pad)[0]  # noqa: E731
        with computing():
            check_streams = [(step(x, pad), pad) for x, pad in check_streams]  # the float layer, before its swap
        streams = run.calibrate_and_swap(prefix, step, streams, propagate)
        trim_heap()  # the float layer just freed (see trim_heap)
    head = lambda x, pad: model.lm_head(model.emb_layer_norm_after(x).transpose(0, 1))  # noqa: E731
    references = [Reference(batch, head(x, pad)) for batch, (x, pad) in zip(checks, check_streams)]
    run.calibrate_and_swap("", head, streams, propagate, rest=True)
    info = CalibrationInfo.for_sequences(name, seqs)
    return run.finish(info, adapter.family), references


class _Run:
    """Statistics, quantizers and swaps gathered layer by layer."""

    def __init__(self, model: nn.Module, cfg: QuantConfig, plan: CalibrationPlan, batches) -> None:
        self.model, self.cfg, self.plan, self.batches = model, cfg, plan, batches
        self.chosen = list(plan.sites)
        self.stats: Dict[str, object] = {}
        self.quants: Dict[str, object] = {}
        self.done: Dict[str, str] = {}
        self.fp_sites: List[str] = []
        self.weight_sqnr: Dict[str, float] = {}
        self.seen = set()

    def calibrate_and_swap(self, prefix: str, step, streams, propagate: str, rest: bool = False):
        sites = [s for s in self.chosen if s.name not in self.seen and (rest or s.name.startswith(prefix))]
        self.seen.update(s.name for s in sites)
        act = [s for s in sites if self.cfg.activations is not None]
        static = [s for s in sites if s.name in self.plan.specs]
        outputs = []
        specs = {s.name: self.plan.specs[s.name] for s in static}
        with computing(), collect_stats(self.model, static, specs) as (stats, mask_state):
            for batch, (x, pad) in zip(self.batches, streams):
                mask_state.batch = batch
                outputs.append((step(x, pad), pad))
            mask_state.batch = None
        self.stats.update(stats)
        quants, fp_sites = fit_activation_quantizers(self.cfg, act, static, stats)
        self.quants.update(quants)
        self.fp_sites += fp_sites
        self.done.update(swap_modules_(self.model, {s.name: s for s in sites}, quants, self.cfg,
                                        weight_sqnr=self.weight_sqnr))
        if propagate == "quantized" and not rest:
            with computing():
                outputs = [(step(x, pad), pad) for x, pad in streams]
        return outputs

    def finish(self, info: CalibrationInfo, family: str) -> nn.Module:
        report = build_report(self.model, self.chosen, self.stats, self.quants, self.cfg, self.weight_sqnr)
        histograms = {n: st.histogram.support() for n, st in self.stats.items() if st.count}
        self.model.ptq_state = QuantState(self.cfg, family, self.chosen, self.done, info, report, self.fp_sites,
                                          histograms)
        apply_special_tokens_(self.model, get_adapter(self.model), self.cfg)  # as pp.quantize does
        use_fast_float_if_integer_(self.model)  # as pp.quantize does: after every layer's calibration
        return self.model


def _embed(model: nn.Module, tokens: torch.Tensor):
    """(residual stream [T, B, C], padding mask or None): ``ESM2.forward`` up to its first layer."""
    padding_mask = tokens.eq(model.padding_idx)
    x = model.embed_scale * model.embed_tokens(tokens)
    if model.token_dropout:
        x.masked_fill_((tokens == model.mask_idx).unsqueeze(-1), 0.0)
        mask_ratio_train = 0.15 * 0.8
        src_lengths = (~padding_mask).sum(-1)
        mask_ratio_observed = (tokens == model.mask_idx).sum(-1).to(x.dtype) / src_lengths
        x = x * (1 - mask_ratio_train) / (1 - mask_ratio_observed)[:, None, None]
    x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
    return x.transpose(0, 1), (padding_mask if padding_mask.any() else None)


def _regression_beside(path: Path, allow_pickle: bool):
    regression = contact_regression_path(path)
    return load_torch_checkpoint(regression, allow_pickle=allow_pickle) if regression.is_file() else None
