"""The sensitivity plot: metric loss per layer, one line per site kind (matplotlib is optional)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ptq_protein.search.units import layer_of

__all__ = ["plot_sensitivity", "site_role"]

log = logging.getLogger(__name__)


def site_role(unit: str, part: str) -> str:
    """What a site is within its block (``self_attn.q_proj``), prefixed by its part: the line it is drawn on."""
    prefix, _ = layer_of(unit)
    role = unit[len(prefix) + 1:] if prefix else unit
    return f"{part}: {role}"


def plot_sensitivity(rows: Sequence[Dict[str, Any]], path: Path, title: str = "") -> Optional[Path]:
    """Save the figure as PNG (and PDF, SVG) at ``path``; None (and a logged line) when matplotlib is missing.

    Left: every ranked unit as a bar, the largest loss at the top, coloured by model part, so no unit is left
    out (units outside numbered blocks, such as ``esm.other``, included). Right: loss per layer, one line per
    site role within a block.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        log.warning("matplotlib is not installed: skipping %s (pip install 'ptq-protein[plot]')", path.name)
        return None
    from ptq_protein.eval.bench.plots import save_figure

    ranked = sorted(rows, key=lambda r: -float(r["loss"]))
    height = max(4.0, 0.16 * len(ranked) + 1.2)
    fig, (bars, layers) = plt.subplots(1, 2, figsize=(12, height), gridspec_kw={"width_ratios": [1.1, 1]})
    _ranked_bars(bars, ranked, plt)
    _layer_lines(layers, rows, matplotlib.ticker.MaxNLocator(integer=True))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def _stack(unit: str) -> str:
    """The numbered stack a layer unit belongs to (``esm.encoder.layer``), one line on the layer axis."""
    prefix, index = layer_of(unit)
    return prefix[: -len(str(index)) - 1] if prefix else unit


def _ranked_bars(ax, ranked: Sequence[Dict[str, Any]], plt) -> None:
    parts = list(dict.fromkeys(str(r["part"]) for r in ranked))
    colours = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(parts)}
    ys = list(range(len(ranked)))
    ax.barh(ys, [float(r["loss"]) for r in ranked], color=[colours[str(r["part"])] for r in ranked], height=0.8)
    ax.set_yticks(ys, [str(r["unit"]) for r in ranked], fontsize=6 if len(ranked) > 40 else 8)
    ax.invert_yaxis()  # rank 1 at the top
    ax.set_xlabel("loss vs FP (quantizing this unit alone)")
    ax.set_title(f"all {len(ranked)} units, ranked", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[p]) for p in parts]
    ax.legend(handles, parts, title="part", fontsize=7, loc="lower right")


def _layer_lines(ax, rows: Sequence[Dict[str, Any]], locator) -> None:
    lines: Dict[str, List[Tuple[int, float]]] = {}
    for row in rows:
        layer = int(row["layer"])
        if layer < 0:
            continue  # units outside numbered blocks have no place on the layer axis (they are in the bars)
        # one line per role within a block (sites), else per model part: layers of different stacks never share one
        label = site_role(row["unit"], row["part"]) if row["kind"] in ("linear", "layernorm") else _stack(row["unit"])
        lines.setdefault(label, []).append((layer, float(row["loss"])))
    for label, points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3, label=label)
    ax.xaxis.set_major_locator(locator)
    ax.set_xlabel("layer (block index)")
    ax.set_ylabel("loss vs FP")
    ax.set_title("loss per layer", fontsize=9)
    if lines:
        ax.legend(fontsize=6, ncol=2 if len(lines) > 12 else 1, loc="best")
