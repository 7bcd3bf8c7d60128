"""Resumed runs check what produced their rows: a NaN 'ok' row is rerun, another model's folder is refused."""

from __future__ import annotations

import csv

import pytest

from ptq_protein.eval.bench.results_store import ResultsStore
from ptq_protein.eval.bench.structure_task import STRUCTURE_COLUMNS
from ptq_protein.models.tiny import tiny_esm2
from ptq_protein.search.sensitivity import sensitivity


def _write(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=STRUCTURE_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "") for c in STRUCTURE_COLUMNS})


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf"])
def test_an_ok_row_with_a_non_finite_metric_is_rerun(tmp_path, bad):
    good = {"target": "7ER1_A", "recipe": "fp", "status": "ok", "length": "300", "tm_score": "0.1440",
            "tm_fidelity": "1"}
    _write(tmp_path / "results.csv", [good, {**good, "target": "7ER0_A", "tm_score": bad}])
    store = ResultsStore(tmp_path / "results.csv", STRUCTURE_COLUMNS, required=("tm_fidelity",))
    assert store.is_done("fp", "7ER1_A") and not store.is_done("fp", "7ER0_A")


def test_put_never_records_a_non_finite_required_metric_as_ok(tmp_path):
    store = ResultsStore(tmp_path / "results.csv", STRUCTURE_COLUMNS, required=("tm_fidelity",))
    store.put({"target": "T1", "recipe": "w8-only", "status": "ok", "tm_fidelity": float("nan")})
    row = store.get("w8-only", "T1")
    assert row["status"].startswith("error") and not store.is_done("w8-only", "T1")
    again = ResultsStore(tmp_path / "results.csv", STRUCTURE_COLUMNS, required=("tm_fidelity",))
    assert not again.is_done("w8-only", "T1")


def test_an_ok_row_without_a_required_metric_is_rerun(tmp_path):
    _write(tmp_path / "results.csv", [{"target": "T1", "recipe": "fp", "status": "ok", "tm_score": "0.5"}])
    store = ResultsStore(tmp_path / "results.csv", STRUCTURE_COLUMNS, required=("tm_fidelity",))
    assert not store.is_done("fp", "T1")


SEQS = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDELKKLLAAGHRW"]


def test_sensitivity_refuses_to_resume_rows_of_another_model(tmp_path):
    """Seed 0's folder resumed with seed 5's model (same class, same sizes) is refused, naming the fingerprint."""
    out = tmp_path / "sens"
    first, _ = tiny_esm2(seed=0)
    kwargs = dict(metric="logits", unit="part", calibration=SEQS, out_dir=out)
    sensitivity(first, "w8a8-uniform", SEQS, **kwargs)
    other, _ = tiny_esm2(seed=5)
    with pytest.raises(ValueError, match="model_fingerprint"):
        sensitivity(other, "w8a8-uniform", SEQS, **kwargs)
    same, _ = tiny_esm2(seed=0)
    again = sensitivity(same, "w8a8-uniform", SEQS, **kwargs)  # the same model resumes
    assert again["rows"]


def test_sensitivity_metric_defaults_to_the_family(tmp_path):
    model, _ = tiny_esm2(seed=0)
    rows = sensitivity(model, "w8a8-uniform", SEQS, unit="part", calibration=SEQS)["rows"]
    assert rows and rows[0]["metric"] == "logits_rel"
