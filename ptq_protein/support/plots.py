"""Histogram plots of calibrated activation sites (matplotlib, imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Sequence, Tuple

import torch

__all__ = ["plot_site_histograms"]


def plot_site_histograms(histograms: Dict[str, Tuple[torch.Tensor, torch.Tensor]], sites: Sequence[str],
                         path: Path, title: str = "") -> Path:
    """One log-scale histogram panel per site, saved as a PNG at ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ValueError("plots need matplotlib: pip install 'ptq-protein[plot]'") from err
    sites = [s for s in sites if s in histograms]
    cols = min(3, max(1, len(sites)))
    rows = max(1, (len(sites) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.0 * rows), squeeze=False)
    for ax, site in zip(axes.flat, sites):
        counts, edges = histograms[site]
        ax.stairs(counts.numpy() + 1e-9, edges.numpy(), fill=True)
        ax.set_yscale("log")
        ax.set_title(site, fontsize=7)
    for ax in list(axes.flat)[len(sites):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path
