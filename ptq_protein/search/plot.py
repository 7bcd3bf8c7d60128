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
    """Save the plot as a PNG at ``path``; returns None (and logs why) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        log.warning("matplotlib is not installed: skipping %s (pip install 'ptq-protein[plot]')", path.name)
        return None
    lines: Dict[str, List[Tuple[int, float]]] = {}
    for row in rows:
        layer = int(row["layer"])
        if layer < 0:
            continue  # units outside numbered blocks have no place on the layer axis
        label = site_role(row["unit"], row["part"]) if row["kind"] in ("linear", "layernorm") else row["kind"]
        lines.setdefault(label, []).append((layer, float(row["loss"])))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("layer (block index)")
    ax.set_ylabel("loss vs FP")
    ax.set_title(title, fontsize=9)
    if lines:
        ax.legend(fontsize=6, ncol=2 if len(lines) > 12 else 1, loc="best")
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path
