"""Figures of an evaluation, drawn to be put in a paper: fixed axes, readable labels, PNG + PDF + SVG.

Per recipe, one panel of the headline metric: FP on x, the recipe on y, both axes
over the metric's whole range (TM-score, GDT and lDDT on [0, 1]) with equal aspect
and the diagonal, so panels of different runs compare at a glance. A last panel
shows how close each recipe's predictions stay to the FP model's own (TM-score of
the quantized fold against the FP fold), one column of points per recipe.
matplotlib is optional: without it the plot is refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

__all__ = ["plot_scatter", "save_figure", "FORMATS"]

FORMATS = ("png", "pdf", "svg")  # every figure is written in each; the PNG path is returned
_PANEL_IN = 3.6  # inches per panel side
_DPI = 150


def plot_scatter(rows: Sequence[Mapping[str, Any]], recipes: Sequence[str], metric, path: Union[str, Path],
                 title: str = "", reference: str = "fp", fidelity=None) -> Path:
    """FP vs quantized ``metric`` per target (one panel per recipe), plus a ``fidelity`` panel when given.

    ``metric`` / ``fidelity`` are :class:`~ptq_protein.eval.bench.summary.MetricSpec`; ``fidelity`` is a
    per-target agreement with the FP prediction (e.g. ``tm_fidelity``), drawn for every recipe but the
    reference. A ``metric`` that is itself a comparison with the reference (``compare_to_fp`` off) gets no
    scatter panels when a ``fidelity`` panel is drawn. Returns the PNG path; the PDF and SVG are written beside it.
    """
    plt = _pyplot()
    others = [r for r in recipes if r != reference] or [reference]
    # A metric that is itself a comparison with the reference (compare_to_fp off) has nothing to scatter against it.
    scattered = others if metric.compare_to_fp or fidelity is None else []
    panels = len(scattered) + (fidelity is not None)
    fig, axes = plt.subplots(1, panels, figsize=(_PANEL_IN * panels, _PANEL_IN + 0.4), squeeze=False)
    ref = values_of(rows, reference, metric.column)
    for ax, recipe in zip(axes.flat, scattered):
        mine = values_of(rows, recipe, metric.column)
        paired = sorted(set(mine) & set(ref))
        xs, ys = [ref[t] for t in paired], [mine[t] for t in paired]
        lo, hi = metric_limits(metric, xs + ys)
        ax.plot([lo, hi], [lo, hi], color="0.6", lw=0.8, ls="--", zorder=1)
        ax.scatter(xs, ys, s=16, alpha=0.8, edgecolor="none", zorder=2)
        ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel=f"{metric.label}, {_pretty(reference)}",
               ylabel=f"{metric.label}, {_pretty(recipe)}", title=f"{_pretty(recipe)} (n = {len(paired)})")
        ax.set_aspect("equal")
    if fidelity is not None:
        _fidelity_panel(axes.flat[-1], rows, others, fidelity)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def save_figure(fig, path: Union[str, Path]) -> Path:
    """Write ``fig`` as ``path`` (PNG) and its PDF / SVG siblings, each atomically; close it; return ``path``."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        for fmt in FORMATS:
            target = path.with_suffix(f".{fmt}")
            tmp = target.with_name(f".{target.stem}.tmp.{fmt}")
            fig.savefig(tmp, dpi=_DPI, format=fmt)
            tmp.replace(target)
    finally:
        plt.close(fig)
    return path


def metric_limits(metric, values: Sequence[float]) -> Tuple[float, float]:
    """The metric's fixed range (``metric.limits``), or the values' span padded by 5% for unbounded ones."""
    if getattr(metric, "limits", None) is not None:
        return metric.limits
    if not values:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    pad = 0.05 * (hi - lo) or 0.05
    return (0.0 if lo >= 0 else lo - pad), hi + pad  # non-negative metrics (RMSD) start at 0


def values_of(rows: Sequence[Mapping[str, Any]], recipe: str, column: str) -> Dict[str, float]:
    """{target: value} of the rows of ``recipe`` with status ok and a finite number in ``column``."""
    out = {}
    for row in rows:
        if row["recipe"] != recipe or row.get("status") != "ok":
            continue
        try:
            value = float(row.get(column))
        except (TypeError, ValueError):
            continue
        if value == value and abs(value) != float("inf"):
            out[row["target"]] = value
    return out


def _fidelity_panel(ax, rows, recipes: Sequence[str], fidelity) -> None:
    """One column of points per recipe: its per-target agreement with the FP prediction, and the median."""
    columns: List[Tuple[str, List[float]]] = [(r, list(values_of(rows, r, fidelity.column).values())) for r in recipes]
    for i, (_recipe, values) in enumerate(columns):
        jitter = [i + 0.12 * ((k * 0.618) % 1 - 0.5) for k in range(len(values))]  # deterministic spread
        ax.scatter(jitter, values, s=14, alpha=0.7, edgecolor="none")
        if values:
            middle = sorted(values)[len(values) // 2]
            ax.plot([i - 0.25, i + 0.25], [middle, middle], color="black", lw=1.2)
    lo, hi = metric_limits(fidelity, [v for _, vals in columns for v in vals])
    ax.set(xlim=(-0.6, len(columns) - 0.4), ylim=(lo, hi), ylabel=fidelity.label,
           title="agreement with the FP prediction")
    ax.set_xticks(range(len(columns)), [_pretty(r) for r, _ in columns], rotation=30, ha="right")


def _pretty(recipe: str) -> str:
    return "FP" if recipe == "fp" else recipe


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("the summary plot needs matplotlib: pip install 'ptq-protein[plot]'") from e
    return plt

