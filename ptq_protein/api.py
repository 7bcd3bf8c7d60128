"""The public entry point: ``pp.quantize(model, recipe, calibration=...)``.

Data flows one way: model → sites → calibration statistics → quantizer
parameters → module swap → (artifact, evaluation). The returned model is the
same class as the input, called exactly like it; its quantization record is
``qmodel.ptq_state`` (a :class:`QuantState`).
"""

from __future__ import annotations

import copy
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.mapped import mapped_file_of, release_after_forward
from ptq_protein.quant.metrics import sqnr_db
from ptq_protein.quant.study_observer import float_reason
from ptq_protein.calibration.calibrate import calibrate
from ptq_protein.calibration.sites import Site, discover_sites, select_sites, set_module
from ptq_protein.calibration.study import study_calibrate
from ptq_protein.config import Backend, QuantConfig, SiteKind, SpecialTokens, TensorQuant
from ptq_protein.errors import InputError
from ptq_protein.nn.convert import swap_modules_
from ptq_protein.nn.modules import ActQuantizer, QuantInput
from ptq_protein.nn.qparams import activation_quantizer, needs_calibration
from ptq_protein.nn.special_tokens import apply_special_tokens_
from ptq_protein.nn.study import StudyActQuant, study_weights_
from ptq_protein.presets import resolve_config
from ptq_protein.report import build_report
from ptq_protein.transforms.gptq_pass import gptq_model_
from ptq_protein.transforms.smoothquant import smooth_model_

__all__ = ["quantize", "QuantState", "CalibrationInfo", "CalibrationPass", "resolve_calibration", "static_sites",
           "calibration_sequences", "calibration_records", "crop_sequence"]

log = logging.getLogger(__name__)

CalibrationArg = Union[None, str, Path, Sequence[str], Sequence[tuple]]


@dataclass
class CalibrationInfo:
    """What the activations were calibrated on (recorded in the artifact's recipe)."""

    name: str
    num_sequences: int
    sha256: str

    @classmethod
    def for_sequences(cls, name: str, sequences: Sequence[str]) -> "CalibrationInfo":
        return cls(name, len(sequences), _sequences_sha(sequences))

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "num_sequences": self.num_sequences, "sha256": self.sha256}


@dataclass
class QuantState:
    """Everything needed to describe, save and reload a quantized model."""

    config: QuantConfig
    family: str
    sites: List[Site]
    quantized: Dict[str, str]
    calibration: Optional[CalibrationInfo]
    report: List[Dict[str, Any]] = field(default_factory=list)
    fp_sites: List[str] = field(default_factory=list)
    histograms: Dict[str, Any] = field(default_factory=dict)  # site -> (counts, edges), for plots
    plan: Optional[Any] = None  # a ptq_protein.site_plan.MixedPlan when the precision differs per unit


@dataclass
class CalibrationPass:
    """The statistics of one calibration pass, which several recipes may read.

    ``specs`` are the per-site specs the statistics were collected with (see
    :mod:`ptq_protein.calibration.sharing`); ``recipes`` names the recipes this
    pass was planned for (made by :func:`ptq_protein.workflows.shared_calibration.calibrate_recipes`).
    """

    info: CalibrationInfo
    specs: Dict[str, TensorQuant]
    stats: Dict[str, Any]  # site (or MATMUL sub-site) name -> SiteStats
    recipes: List[str] = field(default_factory=list)
    study: Dict[str, Any] = field(default_factory=dict)  # site -> StudyTopKObserver, for study-* recipes
    include_special: bool = False  # BOS/EOS rows were in the statistics (special_tokens="include")

    def reason_not_serving_study(self, sites: Sequence[Site], cfg: QuantConfig) -> Optional[str]:
        """Why this pass cannot stand in for the study calibration of ``sites`` under ``cfg`` (None: it can)."""
        for site in sites:
            obs = self.study.get(site.name)
            if obs is None:
                return f"site {site.name} was not calibrated with the study's statistics in this pass"
            if obs.calls != cfg.study.calls or obs.keep < cfg.activations.topk:
                return (f"site {site.name}: this pass kept the top-{obs.keep} of the first {obs.calls} calls; "
                        f"the recipe needs top-{cfg.activations.topk} of the first {cfg.study.calls}")
        return None

    def reason_not_serving(self, sites: Sequence[Site], cfg: QuantConfig) -> Optional[str]:
        """Why this pass cannot stand in for calibrating ``sites`` under ``cfg`` (None: it can)."""
        from ptq_protein.calibration.sharing import StatsNeeds

        if (cfg.special_tokens is SpecialTokens.INCLUDE) != self.include_special:
            return (f"the pass {'included' if self.include_special else 'left out'} the BOS/EOS rows; the recipe's "
                    f"special_tokens is {cfg.special_tokens.value!r}")
        for site in sites:
            have = self.specs.get(site.name)
            if have is None:
                return f"site {site.name} was not calibrated in this pass"
            if not StatsNeeds.of(cfg.activations).covered_by(StatsNeeds.of(have)):
                return f"site {site.name}: its statistics were collected for another range ({have.describe()})"
        return None

    def stats_for(self, sites: Sequence[Site]) -> Dict[str, Any]:
        """The statistics of ``sites`` only (MATMUL sites: their operand sub-sites)."""
        names = {s.name for s in sites}
        return {k: st for k, st in self.stats.items() if k in names or k.split("@", 1)[0] in names}


def _sequences_sha(seqs: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for s in seqs:
        digest.update(s.encode("ascii", "replace") + b"\n")
    return digest.hexdigest()


def _why_calibration(cfg: QuantConfig, to_calibrate: Sequence[Site]) -> str:
    reasons = (["static activations"] if to_calibrate else []) + (["SmoothQuant"] if cfg.smoothquant else []) + \
        (["GPTQ"] if cfg.gptq else [])
    return " and ".join(reasons)


def resolve_calibration(calibration: CalibrationArg, why: str = "static activations") -> tuple:
    """(name, sequences) from a FASTA path, a set spec (``casp14:50``), or a list."""
    return _calibration_name(calibration), [seq for _, seq in calibration_records(calibration, why)]


def calibration_records(calibration: CalibrationArg, why: str = "static activations") -> List[tuple]:
    """(id, sequence) pairs of a FASTA path, a set spec or a list (list items get ids ``seq1``, ...)."""
    if calibration is None:
        raise InputError(f"this recipe has {why} and needs calibration sequences: pass calibration= "
                         "(a FASTA path, a bundled set such as 'casp14:50', or a list of sequences)")
    if isinstance(calibration, (str, Path)):
        text = str(calibration)
        if Path(text).exists():
            from ptq_protein.fasta import read_fasta

            return list(read_fasta(Path(text)))
        from ptq_protein.data.sets import load_set

        bench = load_set(text)
        return [(t.id, t.sequence) for t in bench]
    records = [item if isinstance(item, tuple) else (f"seq{i + 1}", item) for i, item in enumerate(calibration)]
    if not all(isinstance(s, str) for _, s in records):
        raise TypeError("calibration must be a FASTA path, a set name, or a list of sequence strings / (id, seq) tuples")
    return records


def _calibration_name(calibration: CalibrationArg) -> str:
    if isinstance(calibration, (str, Path)):
        return Path(str(calibration)).name if Path(str(calibration)).exists() else str(calibration)
    return "sequences"


def _specs_for(sites: Sequence[Site], config: QuantConfig) -> Dict[str, TensorQuant]:
    return {s.name: config.activations for s in sites if config.activations is not None}


def static_sites(chosen: Sequence[Site], cfg: QuantConfig) -> List[Site]:
    """The chosen sites whose activation quantizers need calibration statistics."""
    if cfg.activations is None:
        return []
    # MATMUL sub-sites (operands of each product) are discovered by calibration, so they always calibrate.
    return [s for s in chosen if needs_calibration(cfg.activations) or s.kind is SiteKind.MATMUL]


def calibration_sequences(adapter, calibration: CalibrationArg, calib_max_length: Optional[int]) -> tuple:
    """(name, sequences) as calibration runs them: validated, and cropped to ``calib_max_length``."""
    name, seqs = resolve_calibration(calibration)
    return name, [crop_sequence(s, calib_max_length) for s in adapter.validate(seqs, where="calibration")]


def quantize(model: nn.Module, config: Union[str, QuantConfig, dict] = "w8a8-pwlq",
             calibration: CalibrationArg = None, *, batch_size: Optional[int] = None, backend: Optional[str] = None,
             inplace: bool = False, progress: bool = False, num_recycles: Optional[int] = None,
             calib_max_length: Optional[int] = None, statistics: Optional[CalibrationPass] = None) -> nn.Module:
    """Quantize an ESM model (fair-esm or transformers) and return it, called like the original.

    Parameters
    ----------
    model : fair-esm ``ESM2`` / ``ProteinBertModel``, transformers ``EsmModel`` /
        ``EsmForMaskedLM`` / ``EsmForProteinFolding``.
    config : a preset name (``"w8a8-pwlq"``, see ``ptq_protein.presets.PRESETS``),
        a :class:`QuantConfig`, or its ``to_dict()``.
    calibration : FASTA path, bundled set spec (``"casp14:50"``), or a list of
        sequences; needed when activations are static.
    batch_size : calibration batch size (None: the model family's, 1 for ESMFold and 4 for language models).
    backend : ``"fake"`` (simulation) or ``"int8"`` (integer GEMMs); overrides the config.
    inplace : modify ``model`` itself instead of a deep copy (the CLI does: no second
        copy of the weights). Float weights are dropped as each layer is swapped.
    num_recycles : ESMFold only: recycles during calibration (default: the model's).
    calib_max_length : crop calibration sequences longer than this to their central
        window of this many residues (None keeps them whole). ESMFold's triangle
        attention is cubic in length, so long sequences dominate CPU calibration.
    statistics : a :class:`CalibrationPass` from an earlier pass over this same
        model (``ptq_protein.workflows.shared_calibration.calibrate_recipes``): used instead of
        calibrating, so several recipes share one pass; ``calibration``,
        ``batch_size``, ``num_recycles`` and ``calib_max_length`` are then unused.
        A pass that lacks this recipe's statistics is refused (ValueError).

    Example
    -------
    >>> qmodel = quantize(model, "w8a8-pwlq", calibration="casp14:50")  # doctest: +SKIP
    >>> logits = qmodel(tokens)["logits"]                                 # doctest: +SKIP
    """
    cfg = resolve_config(config)
    if backend is not None:
        if backend not in {b.value for b in Backend}:
            raise InputError(f"unknown backend {backend!r}; choose one of {', '.join(b.value for b in Backend)}")
        cfg = cfg.replace(backend=Backend(backend))
    _check_backend(cfg)
    adapter = get_adapter(model)
    _check_run_options(adapter, calib_max_length, num_recycles)
    qmodel = model if inplace else copy.deepcopy(model)
    # weights memory-mapped by load_model(mmap=True): hand each layer's pages back once used
    mapped = mapped_file_of(qmodel) if inplace else None
    adapter.prepare(qmodel)
    if cfg.study is not None:
        extra = {"num_recycles": num_recycles} if num_recycles is not None else {}
        return _quantize_study(qmodel, adapter, cfg, calibration, extra, calib_max_length, progress, statistics)
    all_sites = discover_sites(qmodel, adapter)
    if not all_sites:
        raise InputError(f"{type(model).__name__} has no quantizable sites (no Linear or LayerNorm modules)")
    chosen = select_sites(all_sites, cfg)
    if cfg.kinds and not chosen:
        raise InputError(f"recipe {cfg.name!r} selects no site of this model: check kinds/groups/include/exclude")
    act_sites = [s for s in chosen if cfg.activations is not None]
    to_calibrate = static_sites(chosen, cfg)
    calib_info, stats, seqs = None, {}, []
    extra = {"num_recycles": num_recycles} if num_recycles is not None else {}
    transforms = cfg.changes_model_before_calibration
    if statistics is not None and transforms:
        raise ValueError(f"recipe {cfg.name!r} changes the model (SmoothQuant/GPTQ) before its activations are "
                         "calibrated, so a shared calibration pass cannot serve it; pass calibration= instead")
    if to_calibrate and statistics is not None:
        reason = statistics.reason_not_serving(to_calibrate, cfg)
        if reason is not None:
            raise ValueError(f"the calibration pass given as statistics= cannot serve recipe {cfg.name!r}: {reason}; "
                             "plan it with calibrate_recipes, or pass calibration= instead")
        calib_info, stats = statistics.info, statistics.stats_for(to_calibrate)
    elif to_calibrate or transforms:
        name, seqs = resolve_calibration(calibration, why=_why_calibration(cfg, to_calibrate))
        seqs = [crop_sequence(s, calib_max_length) for s in adapter.validate(seqs, where="calibration")]
        calib_info = CalibrationInfo.for_sequences(name, seqs)
    linear_names = [s.name for s in chosen if s.kind is SiteKind.LINEAR]
    if cfg.smoothquant is not None:
        smooth_model_(qmodel, adapter, seqs, cfg.smoothquant, linears=set(linear_names), batch_size=batch_size,
                      forward_kwargs=extra)
    originals: Dict[str, Any] = {}
    weight_codes = {}
    if cfg.gptq is not None:  # GPTQ overwrites the copy's weights: its SQNR is against the float originals
        originals = {n: qmodel.get_submodule(n).weight.detach().clone() for n in linear_names}
        weight_codes = gptq_model_(qmodel, adapter, linear_names, cfg.weights, cfg.gptq, seqs,
                                   batch_size=batch_size, forward_kwargs=extra)
    if to_calibrate and statistics is None:
        with release_after_forward(qmodel, mapped):
            stats = calibrate(qmodel, adapter, to_calibrate, _specs_for(to_calibrate, cfg), seqs,
                              batch_size=batch_size, progress=progress, forward_kwargs=extra,
                              include_special=cfg.special_tokens is SpecialTokens.INCLUDE)
    quants, fp_sites = fit_activation_quantizers(cfg, act_sites, to_calibrate, stats)
    weight_sqnr: Dict[str, float] = {}
    release = None if mapped is None else (lambda old: mapped.release(old.parameters()))
    done = swap_modules_(qmodel, {s.name: s for s in chosen}, quants, cfg, weight_codes, weight_sqnr, release)
    for name, weight in originals.items():
        weight_sqnr[name] = sqnr_db(weight, qmodel.get_submodule(name).dequantized_weight(torch.float32))
    apply_special_tokens_(qmodel, adapter, cfg)
    report = build_report(qmodel, chosen, stats, quants, cfg, weight_sqnr)
    histograms = {name: st.histogram.support() for name, st in stats.items() if st.count}
    qmodel.ptq_state = QuantState(cfg, adapter.family, chosen, done, calib_info, report, fp_sites, histograms)
    return qmodel


def fit_activation_quantizers(cfg: QuantConfig, act_sites: Sequence[Site], to_calibrate: Sequence[Site],
                              stats: Dict[str, Any]) -> tuple:
    """({site: quantizer}, [sites left in floating point]) from calibration statistics."""
    quants: Dict[str, ActQuantizer] = {}
    fp_sites = []
    for site in act_sites:
        if site.kind is SiteKind.MATMUL:
            subs = {k: st for k, st in stats.items() if k.startswith(f"{site.name}@") and st.count}
            quants.update({k: activation_quantizer(cfg.activations, st) for k, st in subs.items()})
            if not subs:
                fp_sites.append(site.name)
            continue
        site_stats = stats.get(site.name)
        if site in to_calibrate and (site_stats is None or site_stats.count == 0):
            fp_sites.append(site.name)
            continue
        quants[site.name] = activation_quantizer(cfg.activations, site_stats)
    if fp_sites:
        log.warning("%d site(s) never saw a residue during calibration and stay in floating point: %s",
                    len(fp_sites), ", ".join(fp_sites[:5]) + (" ..." if len(fp_sites) > 5 else ""))
    return quants, fp_sites


def _check_run_options(adapter, calib_max_length: Optional[int], num_recycles: Optional[int]) -> None:
    """Refuse options that would otherwise be ignored or misread (a negative crop left every site FP)."""
    for name, value, low in (("calib_max_length", calib_max_length, 1), ("num_recycles", num_recycles, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise InputError(f"{name}={value!r} must be None or an integer >= {low}")
    if num_recycles is not None and adapter.family != "hf-esmfold":
        raise InputError(f"num_recycles={num_recycles} only applies to ESMFold; this is a {adapter.family} model: "
                         "drop it")


def _quantize_study(qmodel: nn.Module, adapter, cfg: QuantConfig, calibration: CalibrationArg, forward_kwargs: dict,
                    calib_max_length: Optional[int], progress: bool,
                    statistics: Optional[CalibrationPass] = None) -> nn.Module:
    """A ``study-*`` recipe: the study's calibration, quantizers and W8 (``ptq_protein.quant.study``).

    Order as their ``quant_exp_combine_v1`` notebook: statistics from the float
    model, activation quantizers attached, then W8 over the state dict (which then
    rounds the quantizers' range buffers too). Batch size is always 1. A shared
    ``statistics`` pass (``calibrate_recipes``) replaces the calibration run.
    """
    chosen = [s for s in select_sites(discover_sites(qmodel, adapter), cfg) if s.kind is not SiteKind.MATMUL]
    acts, calib_info, done, fp_sites, report = cfg.activations, None, {}, [], []
    if acts is not None:
        if not chosen:
            raise InputError(f"recipe {cfg.name!r} selects no site of this model: check kinds/groups/include/exclude")
        if statistics is not None:
            reason = statistics.reason_not_serving_study(chosen, cfg)
            if reason is not None:
                raise ValueError(f"the calibration pass given as statistics= cannot serve recipe {cfg.name!r}: "
                                 f"{reason}; plan it with calibrate_recipes, or pass calibration= instead")
            observers, calib_info = statistics.study, statistics.info
        else:
            name, seqs = resolve_calibration(calibration)
            seqs = [crop_sequence(s, calib_max_length) for s in adapter.validate(seqs, where="calibration")]
            observers = study_calibrate(qmodel, adapter, chosen, seqs, acts.topk, cfg.study.calls, forward_kwargs,
                                        progress)
            calib_info = CalibrationInfo.for_sequences(name, seqs)
        fp_why: Dict[str, List[str]] = {}
        for site in chosen:
            obs, bounds = observers[site.name], observers[site.name].bounds(acts.topk)
            why = float_reason(obs, acts.topk)  # never ran, or only zeros (their assert)
            if why is not None:
                fp_sites.append(site.name)
                fp_why.setdefault(why, []).append(site.name)
                continue
            quant = StudyActQuant(acts.scheme, acts.bits, *bounds).to(_device(qmodel.get_submodule(site.name)))
            set_module(qmodel, site.name, QuantInput(qmodel.get_submodule(site.name), quant))
            done[site.name] = f"{site.kind.value} input ({acts.scheme.value})"
            report.append({"site": site.name, "kind": site.kind.value, "group": site.group, "calls": obs.seen,
                           "calls_used": obs.count, "min": float(bounds[0]), "max": float(bounds[1]),
                           "activation": acts.describe()})
        if fp_sites:
            log.warning("%d site(s) stay in floating point: %s", len(fp_sites), "; ".join(
                f"{why}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}" for why, names in fp_why.items()))
    if cfg.weights is not None:
        done.update({k: f"W{cfg.weights.bits} {how}" for k, how in
                     study_weights_(qmodel, cfg.study, cfg.weights.bits).items()})
    qmodel.ptq_state = QuantState(cfg, adapter.family, chosen, done, calib_info, report, fp_sites, {})
    return qmodel


def _device(module: nn.Module):
    for tensor in list(module.parameters()) + list(module.buffers()):
        return tensor.device
    return "cpu"


def crop_sequence(seq: str, max_length: Optional[int]) -> str:
    """The central ``max_length`` residues of ``seq`` (all of it when shorter, or when ``max_length`` is None/0)."""
    if not max_length or len(seq) <= max_length:
        return seq
    start = (len(seq) - max_length) // 2
    return seq[start:start + max_length]


def _check_backend(cfg: QuantConfig) -> None:
    if cfg.backend is not Backend.INT8:
        return
    for label, spec in (("weights", cfg.weights), ("activations", cfg.activations)):
        if spec is not None and spec.bits > 8:
            raise ValueError(f"backend 'int8' runs at most 8-bit codes but {label} are {spec.bits}-bit; use backend='fake'")
    if cfg.weights is not None and cfg.weights.scheme.value != "uniform":
        raise ValueError("backend 'int8' needs uniform weights (piecewise-linear weights run with backend='fake')")
