"""The single-mutant landscape as a heatmap: positions across, the 20 amino acids down, colour = score vs wild type.

Colours are centred on the wild type (0: as good as the wild type; the scale is
symmetric, so red below and blue above read the same on any protein); wild-type
cells carry a dot. matplotlib is optional (the ``plot`` extra):
:func:`can_plot` says whether it is there, so callers can decide before any work.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Union

import numpy as np

from ptq_protein.workloads.mutants import AMINO_ACIDS, DEFAULT_OFFSET
from ptq_protein.workloads.variant_scores import SingleMutantScores

__all__ = ["plot_variant_heatmap", "can_plot"]

_INCH_PER_POSITION = 0.14
_MIN_WIDTH_IN, _MAX_WIDTH_IN, _HEIGHT_IN = 6.0, 40.0, 3.6
_MAX_TICKS = 60  # position labels along the axis: every k-th so that at most this many show
_CLIP_PERCENTILE = 99  # colour scale: |score| at this percentile, so one extreme cell does not wash out the rest


def can_plot() -> bool:
    """True when matplotlib is installed (``pip install 'ptq-protein[plot]'``)."""
    return importlib.util.find_spec("matplotlib") is not None


def plot_variant_heatmap(scores: SingleMutantScores, sequence: str, path: Union[str, Path], title: str = "",
                         offset_idx: int = DEFAULT_OFFSET) -> Path:
    """Draw ``scores.grid - scores.wild_type`` [L, 20] transposed; write ``path`` (PNG) and its PDF/SVG; return path.

    Position labels are ``offset_idx``-based, as the mutant names are.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ptq_protein.eval.bench.plots import save_figure

    delta = (scores.grid.double() - scores.wild_type).numpy().T  # [20, L]
    limit = float(np.percentile(np.abs(delta), _CLIP_PERCENTILE)) or 1.0
    width = min(max(_MIN_WIDTH_IN, _INCH_PER_POSITION * len(sequence) + 1.5), _MAX_WIDTH_IN)
    fig, ax = plt.subplots(figsize=(width, _HEIGHT_IN))
    image = ax.imshow(delta, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
    wild = [(i, AMINO_ACIDS.index(a)) for i, a in enumerate(sequence) if a in AMINO_ACIDS]
    ax.scatter([i for i, _ in wild], [a for _, a in wild], s=4, c="black", marker="o", linewidths=0)
    step = max(1, -(-len(sequence) // _MAX_TICKS))
    ticks = list(range(0, len(sequence), step))
    ax.set_xticks(ticks, [f"{sequence[i]}{i + offset_idx}" for i in ticks], rotation=90, fontsize=6)
    ax.set_yticks(range(len(AMINO_ACIDS)), list(AMINO_ACIDS), fontsize=6)
    ax.set(xlabel="position (wild type)", ylabel="substitution")
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01, label="score - wild type")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
