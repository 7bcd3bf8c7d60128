"""Sensitivity: planted outlier sites rank on top, per-unit swaps equal pp.quantize, outputs and resume."""

import logging
import sys

import numpy as np
import pytest
import torch

import ptq_protein as pp
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.tiny import tiny_esm2
from ptq_protein.search.metrics import top_l_pairs, top_l_precision
from ptq_protein.search.sensitivity import COLUMNS, sensitivity
from ptq_protein.search.units import UnitKind, make_units
from ptq_protein.search.workbench import Workbench
from ptq_protein.support.errors import InputError

SEEDS = (0, 1, 2, 3)


def planted(unit: str) -> bool:
    """Residual-stream LayerNorm inputs: where OutlierSpec's channels live (tests/models/test_outliers.py)."""
    return "layer_norm" in unit


def u_statistic(losses, flags):
    """Mann-Whitney U of the planted units' losses against the rest (ties count one half)."""
    a = [x for x, f in zip(losses, flags) if f]
    b = [x for x, f in zip(losses, flags) if not f]
    return sum((x > y) + 0.5 * (x == y) for x in a for y in b)


def test_planted_outlier_sites_rank_at_the_top(metric_seqs, calib_seqs):
    """On four seeded outlier models, uniform A8 hurts the planted sites most: the top unit is planted in
    every model, and the pooled rank statistic is beyond what 20,000 random rankings reach 1% of the time."""
    observed, tables = 0.0, []
    for seed in SEEDS:
        model, _ = tiny_esm2(seed=seed)
        rows = sensitivity(model, "w8a8-uniform", metric_seqs, metric="logits", calibration=calib_seqs)["rows"]
        losses, flags = [r["loss"] for r in rows], [planted(r["unit"]) for r in rows]
        assert sum(flags) == 5 and len(rows) == 17  # 2 layers x (6 linear + 2 LN) + the final LN
        assert flags[0], (seed, rows[0]["unit"])
        observed += u_statistic(losses, flags)
        tables.append((losses, flags))
    rng = np.random.default_rng(0)
    null = [sum(u_statistic(losses, rng.permutation(flags)) for losses, flags in tables) for _ in range(2000)]
    assert np.mean(np.array(null) >= observed) < 0.01, observed


def test_unit_swap_equals_quantize_with_include(esm2, calib_seqs):
    """A unit swapped in by the workbench gives exactly the logits of pp.quantize restricted to that unit."""
    adapter = get_adapter(esm2)
    batch = adapter.make_batch(calib_seqs[:2])
    bench = Workbench(esm2, pp.get_preset("w8a8-pwlq"), calib_seqs, batch_size=4)
    with torch.no_grad():
        fp = adapter.forward(esm2, batch)["logits"]
        for unit in ("layers.0.fc1", "emb_layer_norm_after", "layers.1.self_attn.q_proj"):
            ref = pp.quantize(esm2, pp.get_preset("w8a8-pwlq").replace(include=(unit,)), calibration=calib_seqs)
            with bench.applied(bench.recipe_specs(pp.get_preset("w8a8-pwlq"), [unit])) as model:
                ours = adapter.forward(model, batch)["logits"]
            torch.testing.assert_close(ours, adapter.forward(ref, batch)["logits"], rtol=0, atol=0)
            assert not torch.equal(ours, fp)
        torch.testing.assert_close(adapter.forward(bench.model, batch)["logits"], fp, rtol=0, atol=0)  # restored


def test_outputs_resume_and_changed_settings(esm2, metric_seqs, calib_seqs, tmp_path, monkeypatch):
    out = tmp_path / "sens"
    first = sensitivity(esm2, "w8a8-pwlq", metric_seqs[:2], metric="logits", unit="layer", out_dir=out,
                        calibration=calib_seqs)
    header = (out / "sensitivity.csv").read_text().splitlines()[0].split(",")
    assert header == ["rank", *COLUMNS]
    assert [r["unit"] for r in first["rows"]] and "## Top" in (out / "summary.md").read_text()
    if first["paths"]["plot"] is not None:
        assert (out / "sensitivity.png").read_bytes()[:4] == b"\x89PNG"
    losses = [float(r["loss"]) for r in first["rows"]]
    assert losses == sorted(losses, reverse=True)

    def never(*args, **kwargs):
        raise AssertionError("a finished unit was measured again")

    monkeypatch.setattr(Workbench, "applied", never)
    again = sensitivity(esm2, "w8a8-pwlq", metric_seqs[:2], metric="logits", unit="layer", out_dir=out,
                        calibration=calib_seqs)
    assert [r["unit"] for r in again["rows"]] == [r["unit"] for r in first["rows"]]
    before = (out / "sensitivity.csv").read_text()
    with pytest.raises(ValueError, match="different run"):
        sensitivity(esm2, "w8a8-pwlq", metric_seqs[:2], metric="contacts", unit="layer", out_dir=out,
                    calibration=calib_seqs)
    assert (out / "sensitivity.csv").read_text() == before


def test_a_metric_the_model_cannot_give_writes_nothing(esm2, tmp_path):
    with pytest.raises(InputError, match="needs a folding model"):
        sensitivity(esm2, "w8a8-pwlq", ["MKTAYIAK"], metric="tm", out_dir=tmp_path / "x", calibration=["MKTAYIAK"])
    assert not (tmp_path / "x").exists()


def test_units_by_site_layer_and_part(esm2, calib_seqs):
    bench = Workbench(esm2, pp.get_preset("w8a8-pwlq"), calib_seqs[:1])
    sites = make_units(bench.sites, UnitKind.SITE)
    layers = make_units(bench.sites, UnitKind.LAYER)
    parts = make_units(bench.sites, UnitKind.PART)
    assert [u.name for u in layers] == ["layers.0", "layers.1", "esm.other"]
    assert [u.layer for u in layers] == [0, 1, -1] and len(parts) == 1
    assert sorted(s for u in layers for s in u.site_names) == sorted(u.name for u in sites)


def test_tm_and_contacts_of_esmfold_against_itself_are_one(metric_seqs, calib_seqs):
    from ptq_protein.models.tiny import tiny_esmfold
    from ptq_protein.search.metrics import Scorer

    model, _ = tiny_esmfold(seed=0)
    adapter = get_adapter(model)
    for metric in ("tm", "contacts"):
        scorer = Scorer(model, adapter, metric, [s[:40] for s in metric_seqs[:1]])
        assert scorer.score(model)[metric] == pytest.approx(1.0, abs=1e-9)


def test_top_l_precision_against_brute_force():
    rng = np.random.default_rng(1)
    ref, pred = rng.normal(size=(30, 30)), rng.normal(size=(30, 30))
    pairs = sorted(((ref[i, j], i, j) for i in range(30) for j in range(i + 6, 30)), reverse=True)[:30]
    assert top_l_pairs(ref) == {(i, j) for _, i, j in pairs}
    assert top_l_precision(ref, ref) == 1.0
    mine = sorted(((pred[i, j], i, j) for i in range(30) for j in range(i + 6, 30)), reverse=True)[:30]
    expected = len({(i, j) for _, i, j in mine} & {(i, j) for _, i, j in pairs}) / 30
    assert top_l_precision(pred, ref) == pytest.approx(expected)


def test_plot_is_skipped_with_a_note_without_matplotlib(tmp_path, monkeypatch, caplog):
    from ptq_protein.search.plot import plot_sensitivity

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with caplog.at_level(logging.WARNING):
        assert plot_sensitivity([{"unit": "layers.0.fc1", "kind": "linear", "layer": 0, "part": "esm", "loss": 0.1}],
                                tmp_path / "p.png") is None
    assert "matplotlib is not installed" in caplog.text and not (tmp_path / "p.png").exists()
