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

from torch import nn

from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.mapped import mapped_file_of, release_after_forward
from ptq_protein.calibration.calibrate import calibrate
from ptq_protein.config import Backend, QuantConfig, SiteKind, TensorQuant
from ptq_protein.nn.convert import swap_modules_
from ptq_protein.errors import InputError
from ptq_protein.nn.modules import ActQuantizer
from ptq_protein.presets import resolve_config
from ptq_protein.nn.qparams import activation_quantizer, needs_calibration
from ptq_protein.report import build_report
from ptq_protein.calibration.sites import Site, discover_sites, select_sites

__all__ = ["quantize", "QuantState", "CalibrationInfo", "resolve_calibration"]

log = logging.getLogger(__name__)

CalibrationArg = Union[None, str, Path, Sequence[str], Sequence[tuple]]


@dataclass
class CalibrationInfo:
    """What the activations were calibrated on (recorded in the artifact's recipe)."""

    name: str
    num_sequences: int
    sha256: str

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


def _sequences_sha(seqs: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for s in seqs:
        digest.update(s.encode("ascii", "replace") + b"\n")
    return digest.hexdigest()


def resolve_calibration(calibration: CalibrationArg) -> tuple:
    """(name, sequences) from a FASTA path, a set spec (``casp14:50``), or a list."""
    if calibration is None:
        raise InputError("this recipe has static activations and needs calibration sequences: pass calibration= "
                         "(a FASTA path, a bundled set such as 'casp14:50', or a list of sequences)")
    if isinstance(calibration, (str, Path)):
        text = str(calibration)
        if Path(text).exists():
            from ptq_protein.fasta import read_fasta

            records = read_fasta(Path(text))
            return Path(text).name, [seq for _, seq in records]
        from ptq_protein.data.sets import load_set

        bench = load_set(text)
        return text, list(bench.sequences())
    seqs = []
    for item in calibration:
        seqs.append(item[1] if isinstance(item, tuple) else item)
    if not all(isinstance(s, str) for s in seqs):
        raise TypeError("calibration must be a FASTA path, a set name, or a list of sequence strings / (id, seq) tuples")
    return "sequences", seqs


def _specs_for(sites: Sequence[Site], config: QuantConfig) -> Dict[str, TensorQuant]:
    return {s.name: config.activations for s in sites if config.activations is not None}


def quantize(model: nn.Module, config: Union[str, QuantConfig, dict] = "w8a8-pwlq",
             calibration: CalibrationArg = None, *, batch_size: int = 4, backend: Optional[str] = None,
             inplace: bool = False, progress: bool = False, num_recycles: Optional[int] = None,
             calib_max_length: Optional[int] = None) -> nn.Module:
    """Quantize an ESM model (fair-esm or transformers) and return it, called like the original.

    Parameters
    ----------
    model : fair-esm ``ESM2`` / ``ProteinBertModel``, transformers ``EsmModel`` /
        ``EsmForMaskedLM`` / ``EsmForProteinFolding``.
    config : a preset name (``"w8a8-pwlq"``, see ``ptq_protein.presets.PRESETS``),
        a :class:`QuantConfig`, or its ``to_dict()``.
    calibration : FASTA path, bundled set spec (``"casp14:50"``), or a list of
        sequences; needed when activations are static.
    batch_size : calibration batch size.
    backend : ``"fake"`` (simulation) or ``"int8"`` (integer GEMMs); overrides the config.
    inplace : modify ``model`` itself instead of a deep copy (the CLI does: no second
        copy of the weights). Float weights are dropped as each layer is swapped.
    num_recycles : ESMFold only: recycles during calibration (default: the model's).
    calib_max_length : crop calibration sequences longer than this to their central
        window of this many residues (None keeps them whole). ESMFold's triangle
        attention is cubic in length, so long sequences dominate CPU calibration.

    Example
    -------
    >>> qmodel = quantize(model, "w8a8-pwlq", calibration="casp14:50")  # doctest: +SKIP
    >>> logits = qmodel(tokens)["logits"]                                 # doctest: +SKIP
    """
    cfg = resolve_config(config)
    if backend is not None:
        cfg = cfg.replace(backend=Backend(backend))
    _check_backend(cfg)
    adapter = get_adapter(model)
    qmodel = model if inplace else copy.deepcopy(model)
    # weights memory-mapped by load_model(mmap=True): hand each layer's pages back once used
    mapped = mapped_file_of(qmodel) if inplace else None
    adapter.prepare(qmodel)
    all_sites = discover_sites(qmodel, adapter)
    if not all_sites:
        raise InputError(f"{type(model).__name__} has no quantizable sites (no Linear or LayerNorm modules)")
    chosen = select_sites(all_sites, cfg)
    if cfg.kinds and not chosen:
        raise InputError(f"recipe {cfg.name!r} selects no site of this model: check kinds/groups/include/exclude")
    act_sites = [s for s in chosen if cfg.activations is not None]
    # MATMUL sub-sites (operands of each product) are discovered by calibration, so they always calibrate.
    static_sites = [s for s in act_sites if needs_calibration(cfg.activations) or s.kind is SiteKind.MATMUL]
    calib_info, stats = None, {}
    if static_sites:
        name, seqs = resolve_calibration(calibration)
        seqs = [_crop(s, calib_max_length) for s in adapter.validate(seqs, where="calibration")]
        extra = {"num_recycles": num_recycles} if num_recycles is not None else {}
        with release_after_forward(qmodel, mapped):
            stats = calibrate(qmodel, adapter, static_sites, _specs_for(static_sites, cfg), seqs,
                              batch_size=batch_size, progress=progress, forward_kwargs=extra)
        calib_info = CalibrationInfo(name, len(seqs), _sequences_sha(seqs))
    quants, fp_sites = fit_activation_quantizers(cfg, act_sites, static_sites, stats)
    weight_sqnr: Dict[str, float] = {}
    release = None if mapped is None else (lambda old: mapped.release(old.parameters()))
    done = swap_modules_(qmodel, {s.name: s for s in chosen}, quants, cfg, weight_sqnr, release)
    report = build_report(qmodel, chosen, stats, quants, cfg, weight_sqnr)
    histograms = {name: st.histogram.support() for name, st in stats.items() if st.count}
    qmodel.ptq_state = QuantState(cfg, adapter.family, chosen, done, calib_info, report, fp_sites, histograms)
    return qmodel


def fit_activation_quantizers(cfg: QuantConfig, act_sites: Sequence[Site], static_sites: Sequence[Site],
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
        if site in static_sites and (site_stats is None or site_stats.count == 0):
            fp_sites.append(site.name)
            continue
        quants[site.name] = activation_quantizer(cfg.activations, site_stats)
    if fp_sites:
        log.warning("%d site(s) never saw a residue during calibration and stay in floating point: %s",
                    len(fp_sites), ", ".join(fp_sites[:5]) + (" ..." if len(fp_sites) > 5 else ""))
    return quants, fp_sites


def _crop(seq: str, max_length: Optional[int]) -> str:
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
