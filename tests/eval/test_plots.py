"""Figures for papers: fixed metric axes, a panel against the FP prediction, every ranked unit, three formats."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from ptq_protein.eval.bench import plots  # noqa: E402
from ptq_protein.eval.bench.structure_task import STRUCTURE_METRICS  # noqa: E402
from ptq_protein.search import plot as search_plot  # noqa: E402


@pytest.fixture()
def captured(monkeypatch):
    """The figures handed to save_figure (still written; their axes stay readable after closing)."""
    figures = []
    real = plots.save_figure

    def keep(fig, path):
        figures.append(fig)
        return real(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    return figures


def _rows():
    rows = []
    for i in range(6):
        rows.append({"target": f"T{i}", "recipe": "fp", "status": "ok", "tm_score": 0.14 + 0.001 * i,
                     "tm_fidelity": 1.0})
        rows.append({"target": f"T{i}", "recipe": "w8a8-pwlq", "status": "ok", "tm_score": 0.141 + 0.001 * i,
                     "tm_fidelity": 0.97})
    return rows


def test_tm_axes_are_the_whole_unit_interval_with_a_fidelity_panel(tmp_path, captured):
    fidelity = next(m for m in STRUCTURE_METRICS if m.column == "tm_fidelity")
    png = plots.plot_scatter(_rows(), ["fp", "w8a8-pwlq"], STRUCTURE_METRICS[0], tmp_path / "fig.png",
                             fidelity=fidelity)
    for fmt in plots.FORMATS:
        assert png.with_suffix(f".{fmt}").stat().st_size > 0
    scatter, agreement = captured[0].axes
    assert scatter.get_xlim() == (0.0, 1.0) and scatter.get_ylim() == (0.0, 1.0)  # not auto-zoomed to 0.14-0.15
    assert scatter.get_aspect() == 1.0
    assert "TM-score vs native" in scatter.get_xlabel() and "_" not in scatter.get_xlabel()
    assert agreement.get_ylim() == (0.0, 1.0) and "FP prediction" in agreement.get_ylabel()


def test_rmsd_axes_follow_the_values():
    rmsd = next(m for m in STRUCTURE_METRICS if m.column == "rmsd")
    lo, hi = plots.metric_limits(rmsd, [3.0, 12.0])
    assert lo == 0.0 and hi > 12.0


def test_sensitivity_shows_every_ranked_unit_top_first(tmp_path, captured):
    rows = [{"unit": "esm.other", "kind": "other", "layer": -1, "part": "esm", "loss": 0.3},
            {"unit": "esm.encoder.layer.0", "kind": "layer", "layer": 0, "part": "esm", "loss": 0.1},
            {"unit": "esm.encoder.layer.1", "kind": "layer", "layer": 1, "part": "esm", "loss": 0.2},
            {"unit": "trunk.blocks.0", "kind": "layer", "layer": 0, "part": "trunk", "loss": 0.05}]
    png = search_plot.plot_sensitivity(rows, tmp_path / "sens.png", title="t")
    assert png is not None and png.with_suffix(".pdf").exists() and png.with_suffix(".svg").exists()
    bars = captured[0].axes[0]
    labels = [t.get_text() for t in bars.get_yticklabels()]
    assert labels == ["esm.other", "esm.encoder.layer.1", "esm.encoder.layer.0", "trunk.blocks.0"]
    assert bars.yaxis_inverted()  # rank 1 at the top
    lines = captured[0].axes[1].get_legend_handles_labels()[1]
    assert sorted(lines) == ["esm.encoder.layer", "trunk.blocks"]  # stacks never share a line
