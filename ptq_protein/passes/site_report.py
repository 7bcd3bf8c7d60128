"""Per-site report: range, asymmetry, kurtosis, chosen parameters, quantization SQNR.

``min``/``max`` and the moments are over the calibration positions (residues, and
BOS/EOS with ``SpecialTokens.INCLUDE``); ``special_min``/``special_max`` are the
BOS/EOS positions' own range, always reported separately (LM sites only).

Activation SQNR is estimated on the calibration histogram (bin centres weighted
by their counts), so no raw activations are kept; weight SQNR is exact.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

from ptq_protein.calibration.sites import Site
from ptq_protein.nn.modules import ActQuantizer, QuantInput, QuantLinear
from ptq_protein.recipes.config import QuantConfig, SiteKind

__all__ = ["build_report", "report_markdown", "sqnr_db", "asymmetry"]


def sqnr_db(signal_power: float, noise_power: float) -> float:
    """10·log10(E[x²] / E[(x − x̂)²]); +inf when the quantizer is exact."""
    if noise_power <= 0:
        return math.inf
    if signal_power <= 0:
        return -math.inf
    return 10.0 * math.log10(signal_power / noise_power)


def asymmetry(lo: float, hi: float) -> float:
    """(max + min) / (max − min): 0 for a symmetric range, ±1 for a one-sided one."""
    span = hi - lo
    return 0.0 if span <= 0 else (hi + lo) / span


def _histogram_sqnr(stats, quant: ActQuantizer) -> Optional[float]:
    scale = getattr(quant, "scale", None)
    if not quant.is_static or (scale is not None and scale.dim() > 0):
        return None  # dynamic, or per-channel parameters: the pooled histogram has no channel axis
    counts, edges = stats.histogram.support()
    centers = 0.5 * (edges[1:] + edges[:-1])
    if counts.sum() <= 0:
        return None
    x = centers.to(torch.float32)
    err = (quant(x).double() - centers.double()) ** 2
    weights = counts.double() / counts.sum()
    noise = float((err * weights).sum())
    signal = float((centers.double() ** 2 * weights).sum())
    return sqnr_db(signal, noise)


def _weight_entry(module: QuantLinear, weight_sqnr: Optional[float]) -> Dict[str, Any]:
    if module.weight_spec is None:
        return {}
    entry: Dict[str, Any] = {"weight": module.weight_spec.describe()}
    if weight_sqnr is not None:
        entry["weight_sqnr_db"] = weight_sqnr
    return entry


def _activation_entry(stats, quant: Optional[ActQuantizer]) -> Dict[str, Any]:
    entry: Dict[str, Any] = {}
    if stats is not None and stats.count:
        m = stats.moments
        lo, hi = float(m.min_val), float(m.max_val)
        entry.update(count=stats.count, min=lo, max=hi, mean=float(m.mean), std=float(m.std()),
                     asymmetry=asymmetry(lo, hi), kurtosis=float(m.kurtosis))
    if stats is not None and getattr(stats, "special_count", 0):
        entry.update(special_count=stats.special_count, special_min=float(stats.special.min_val),
                     special_max=float(stats.special.max_val))
    if quant is not None:
        entry["activation"] = quant.spec.describe()
        state = quant.state()
        if "codebook" in state:
            cb = state["codebook"]
            entry["regions"] = len(cb["code_lo"])
            entry["thresholds"] = cb["thresholds"]
        if "scale" in state:
            entry["scale"] = state["scale"]
            entry["zero_point"] = state["zero_point"]
        if stats is not None and stats.count:
            entry["sqnr_db"] = _histogram_sqnr(stats, quant)
    return entry


def build_report(qmodel: nn.Module, sites: Sequence[Site], stats: Dict[str, Any],
                 quants: Dict[str, ActQuantizer], config: QuantConfig,
                 weight_sqnr: Optional[Dict[str, float]] = None) -> List[Dict[str, Any]]:
    """One dict per site, in model order; ``weight_sqnr`` from :func:`~ptq_protein.nn.convert.swap_modules_`."""
    rows = []
    for site in sites:
        if site.kind is SiteKind.MATMUL:
            for name in sorted(k for k in quants if k.startswith(f"{site.name}@")):
                row = {"site": name, "kind": site.kind.value, "group": site.group}
                row.update(_activation_entry(stats.get(name), quants[name]))
                rows.append(row)
            continue
        row: Dict[str, Any] = {"site": site.name, "kind": site.kind.value, "group": site.group}
        module = qmodel.get_submodule(site.name)
        if isinstance(module, QuantLinear):
            row.update(_weight_entry(module, None if weight_sqnr is None else weight_sqnr.get(site.name)))
        row.update(_activation_entry(stats.get(site.name), quants.get(site.name)))
        if not isinstance(module, (QuantLinear, QuantInput)):
            row["status"] = "floating point"
        rows.append(row)
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.4g}"
    return str(value)


_COLUMNS = ("site", "kind", "group", "min", "max", "special_min", "special_max", "asymmetry", "kurtosis", "sqnr_db",
            "weight_sqnr_db", "activation")


def report_markdown(rows: Sequence[Dict[str, Any]], title: str = "Per-site quantization report") -> str:
    """A markdown table of the report rows."""
    columns = _COLUMNS + (("choice",) if any("choice" in r for r in rows) else ())  # mixed precision: per-unit choice
    lines = [f"# {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"
