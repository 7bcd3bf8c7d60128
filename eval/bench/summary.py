"""Summaries of an evaluation table: per-recipe statistics, paired Δ vs FP, summary.md and a scatter plot.

Δ vs FP is paired by target: for each recipe, the targets scored under both FP
and that recipe give differences ``d_i = recipe_i - fp_i``; the table reports
their mean with a percentile-bootstrap 95% interval (resampling targets), and
per-target wins / losses / ties (a win is a difference in the better direction
larger than :data:`TIE_TOLERANCE`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ptq_protein.eval.bench.plots import plot_scatter, values_of
from ptq_protein.support.io_utils import atomic_write_text

__all__ = ["MetricSpec", "RecipeSummary", "bootstrap_mean_ci", "summarize", "render_summary", "plot_scatter",
           "write_outputs", "TIE_TOLERANCE", "BOOTSTRAP_RESAMPLES"]

logger = logging.getLogger(__name__)

BOOTSTRAP_RESAMPLES = 2000  # percentile bootstrap; 2000 resamples keep the 2.5/97.5% ends stable to ~1e-3
BOOTSTRAP_SEED = 0  # the summary must be reproducible run to run
CONFIDENCE = 0.95
TIE_TOLERANCE = 1e-4  # below the 4 decimals TMscore prints: differences this small are ties
_WORST_SHOWN = 5
SUMMARY_NAME, PLOT_NAME = "summary.md", "fp_vs_quantized.png"


@dataclass(frozen=True)
class MetricSpec:
    """A results column to summarise: its label, direction, and whether Δ vs FP makes sense for it."""

    column: str
    label: str
    higher_is_better: bool = True
    compare_to_fp: bool = True
    limits: Optional[Tuple[float, float]] = (0.0, 1.0)  # the metric's whole range, the plots' fixed axes (None: free)

    def __post_init__(self) -> None:
        if not self.column or not self.label:
            raise ValueError(f"MetricSpec needs a column and a label, got {self.column!r}, {self.label!r}")


@dataclass(frozen=True)
class RecipeSummary:
    """One recipe's statistics for one metric (NaN when undefined, e.g. Δ for fp itself)."""

    recipe: str
    n: int
    mean: float
    median: float
    delta: float = math.nan
    delta_low: float = math.nan
    delta_high: float = math.nan
    n_paired: int = 0
    wins: int = 0
    losses: int = 0
    ties: int = 0


def bootstrap_mean_ci(values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES,
                      confidence: float = CONFIDENCE, seed: int = BOOTSTRAP_SEED) -> Tuple[float, float, float]:
    """(mean, low, high): the mean of ``values`` [N] and its percentile-bootstrap interval.

    Examples
    --------
    >>> bootstrap_mean_ci([1.0, 1.0, 1.0])
    (1.0, 1.0, 1.0)
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"bootstrap needs a non-empty 1-D array of finite values, got shape {x.shape}")
    if not 0 < confidence < 1 or resamples < 1:
        raise ValueError(f"confidence={confidence} must be in (0, 1) and resamples={resamples} >= 1")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(x.mean()), float(low), float(high)


def summarize(rows: Sequence[Mapping[str, Any]], recipes: Sequence[str], metric: MetricSpec,
              reference: str = "fp") -> List[RecipeSummary]:
    """Per-recipe n / mean / median of ``metric`` and, paired by target, Δ vs ``reference``."""
    values = {r: values_of(rows, r, metric.column) for r in recipes}
    ref = values.get(reference, {})
    out = []
    for recipe in recipes:
        mine = values[recipe]
        arr = np.array(list(mine.values()), dtype=np.float64)
        stats = dict(recipe=recipe, n=int(arr.size), mean=float(arr.mean()) if arr.size else math.nan,
                     median=float(np.median(arr)) if arr.size else math.nan)
        paired = sorted(set(mine) & set(ref))
        if recipe != reference and metric.compare_to_fp and paired:
            diff = np.array([mine[t] - ref[t] for t in paired])
            sign = 1.0 if metric.higher_is_better else -1.0
            delta, low, high = bootstrap_mean_ci(diff)
            stats.update(delta=delta, delta_low=low, delta_high=high, n_paired=len(paired),
                         wins=int((sign * diff > TIE_TOLERANCE).sum()),
                         losses=int((sign * diff < -TIE_TOLERANCE).sum()),
                         ties=int((np.abs(diff) <= TIE_TOLERANCE).sum()))
        out.append(RecipeSummary(**stats))
    return out


def render_summary(rows: Sequence[Mapping[str, Any]], recipes: Sequence[str], target_ids: Sequence[str],
                   metrics: Sequence[MetricSpec], title: str, note: str = "", details: Sequence[str] = ()) -> str:
    """The summary.md text: headline table with Δ vs FP, all-metric means, worst targets, rows not scored.

    ``details``: lines about how the metrics were computed, printed under the counts.
    """
    head = metrics[0]
    lines = [f"# {title}", ""]
    if note:
        lines += [f"> **Note:** {note}", ""]
    lines += [f"{len(target_ids)} targets x {len(recipes)} recipes; {_status_line(rows, recipes, head)}", ""]
    lines += [line for d in details for line in (d, "")]
    lines += [f"## {head.label}", "",
              "| recipe | n | mean | median | Δ mean vs FP [95% CI] | wins / losses / ties |",
              "| --- | ---: | ---: | ---: | --- | --- |"]
    for s in summarize(rows, recipes, head):
        delta = "—" if math.isnan(s.delta) else f"{s.delta:+.4f} [{s.delta_low:+.4f}, {s.delta_high:+.4f}]"
        wlt = "—" if not s.n_paired else f"{s.wins} / {s.losses} / {s.ties}"
        lines.append(f"| {s.recipe} | {s.n} | {_fmt(s.mean)} | {_fmt(s.median)} | {delta} | {wlt} |")
    lines += ["", f"Δ is paired by target (recipe − FP), 95% percentile bootstrap over targets "
              f"({BOOTSTRAP_RESAMPLES} resamples); |Δ| ≤ {TIE_TOLERANCE:g} is a tie.", "",
              "## Means of every metric", "",
              "| recipe | " + " | ".join(m.label for m in metrics) + " |",
              "| --- |" + " ---: |" * len(metrics)]
    table = {m.column: {s.recipe: s for s in summarize(rows, recipes, m)} for m in metrics}
    for recipe in recipes:
        lines.append(f"| {recipe} | " + " | ".join(_fmt(table[m.column][recipe].mean) for m in metrics) + " |")
    lines += _worst_targets(rows, recipes, head) + _not_scored(rows)
    return "\n".join(lines) + "\n"


def write_outputs(out_dir: Union[str, Path], rows: Sequence[Mapping[str, Any]], recipes: Sequence[str],
                  target_ids: Sequence[str], metrics: Sequence[MetricSpec], title: str,
                  note: str = "", details: Sequence[str] = ()) -> Dict[str, Path]:
    """Write ``summary.md`` and the figure (headline = ``metrics[0]``; PNG, PDF, SVG) into ``out_dir``; return paths.

    Only rows of ``recipes`` x ``target_ids`` are summarised, so a resumed run
    over a subset (``--limit``) summarises what it was asked for.
    """
    out_dir = Path(out_dir)
    wanted = set(target_ids)
    rows = [r for r in rows if r["target"] in wanted and r["recipe"] in recipes]
    summary = out_dir / SUMMARY_NAME
    atomic_write_text(summary, render_summary(rows, recipes, target_ids, metrics, title, note, details))
    fidelity = next((m for m in metrics if not m.compare_to_fp and m.higher_is_better), None)
    plot = plot_scatter(rows, recipes, metrics[0], out_dir / PLOT_NAME, title=title, fidelity=fidelity)
    return {"summary": summary, "plot": plot}


# --- helpers ----------------------------------------------------------------------


def _fmt(value: float) -> str:
    """4 decimals; small non-zero values (errors vs FP) in scientific notation so they do not read as 0."""
    if math.isnan(value):
        return "—"
    return f"{value:.2e}" if 0 < abs(value) < 1e-3 else f"{value:.4f}"


def _status_line(rows: Sequence[Mapping[str, Any]], recipes: Sequence[str], head: MetricSpec) -> str:
    """Counts per recipe; where some ok rows have no headline value (no native), how many do: the table's n."""
    parts = []
    for recipe in recipes:
        mine = [r for r in rows if r["recipe"] == recipe]
        ok = sum(r["status"] == "ok" for r in mine)
        skipped = sum(r["status"].startswith("skipped") for r in mine)
        scored = len(values_of(rows, recipe, head.column))
        with_head = f" ({scored} with {head.column})" if scored != ok else ""
        parts.append(f"{recipe}: {ok} ok{with_head}, {skipped} skipped, {len(mine) - ok - skipped} failed")
    return "; ".join(parts) + "."


def _worst_targets(rows: Sequence[Mapping[str, Any]], recipes: Sequence[str], metric: MetricSpec,
                   reference: str = "fp") -> List[str]:
    ref = values_of(rows, reference, metric.column)
    sign = 1.0 if metric.higher_is_better else -1.0
    lines = []
    for recipe in (r for r in recipes if r != reference):
        mine = values_of(rows, recipe, metric.column)
        diffs = sorted((sign * (mine[t] - ref[t]), t) for t in set(mine) & set(ref))
        worst = [f"{t} ({sign * d:+.4f})" for d, t in diffs[:_WORST_SHOWN] if d < -TIE_TOLERANCE]
        if worst:
            lines.append(f"- {recipe}: " + ", ".join(worst))
    return (["", f"## Largest losses vs FP ({metric.column})", ""] + lines) if lines else []


def _not_scored(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    bad = [r for r in rows if r["status"] != "ok"]
    if not bad:
        return []
    return ["", "## Not scored", ""] + [f"- {r['recipe']} / {r['target']}: {r['status']}" for r in bad]
