"""Resumed runs check what produced their rows: a NaN 'ok' row is rerun, another model's folder is refused."""

from __future__ import annotations

import csv
import json

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


def _fasta(path, seqs):
    path.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(seqs)))
    return path


def test_sensitivity_refuses_a_resume_whose_calibration_file_changed(tmp_path):
    """Same path, same number of sequences, other content: the resume names the file and stops."""
    calib = _fasta(tmp_path / "calib.fa", SEQS)
    kwargs = dict(metric="logits", unit="part", calibration=str(calib), out_dir=tmp_path / "sens")
    model, _ = tiny_esm2(seed=0)
    sensitivity(model, "w8a8-uniform", SEQS, **kwargs)
    _fasta(calib, ["GGGGGGGGGGKKKKKKKKKKWWWWW", "PPPPPPPPAAAAAAAA"])
    with pytest.raises(ValueError, match=r"calib\.fa changed content"):
        sensitivity(model, "w8a8-uniform", SEQS, **kwargs)


def test_eval_refuses_a_resume_whose_calibration_or_set_file_changed(tmp_path, capsys):
    from ptq_protein.cli.main import main

    calib = _fasta(tmp_path / "calib.fa", SEQS)
    bench = _fasta(tmp_path / "set.fa", ["MKTAYIAKQRQISFVKSHFSRQ", "MENDELKKLLAAGHRWAAKK"])
    argv = ["eval", "contacts", "--model", "tiny-esm2", "--recipes", "fp,w8a8-uniform", "--quiet",
            "--out", str(tmp_path / "out")]
    assert main([*argv, "--set", f"{bench}:1", "--calib", str(calib)]) == 0
    for path, seqs in ((calib, ["GGGGGGGGGGKKKKKKKKKKWWWWW", "PPPPPPPPAAAAAAAA"]),
                       (bench, ["WWWWWWWWWWWWWWWWWWWWWW", "MENDELKKLLAAGHRWAAKK"])):
        original = path.read_text()
        _fasta(path, seqs)
        capsys.readouterr()
        assert main([*argv, "--set", f"{bench}:2", "--calib", str(calib)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"{path} changed content" in err and "\n" not in err
        path.write_text(original)
    assert main([*argv, "--set", f"{bench}:2", "--calib", str(calib)]) == 0  # the same files resume


def test_a_row_whose_output_points_outside_the_folder_is_redone(tmp_path, capsys):
    from ptq_protein.cli.main import main

    out = tmp_path / "out"
    argv = ["eval", "contacts", "--model", "tiny-esm2", "--recipes", "fp", "--set", "cameo139:1", "--quiet",
            "--out", str(out), "--json"]
    assert main(argv) == 0
    outside = tmp_path / "elsewhere.npy"
    outside.write_bytes(b"x")
    with open(out / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for cell in (str(outside), "../elsewhere.npy"):
        rows[0]["contacts"] = cell
        with open(out / "results.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        capsys.readouterr()
        assert main(argv) == 0
        counts = json.loads(capsys.readouterr().out)["counts"]
        assert counts["ok"] == 1 and counts["resumed"] == 0, cell


def test_a_run_record_from_before_input_digests(tmp_path):
    """Bundled sets read no file: such a record still resumes. One that read files is refused, saying why."""
    from ptq_protein.eval.bench.results_store import check_run_info
    from ptq_protein.passes.sequences import with_input_digests

    check_run_info(tmp_path, {"command": "eval", "set": "cameo139"})
    check_run_info(tmp_path, with_input_digests({"command": "eval", "set": "cameo139"}, {"--set": "cameo139"}))
    calib = _fasta(tmp_path / "calib.fa", SEQS)
    with pytest.raises(ValueError, match=r"recorded no digest of its input files \(--calib .*calib\.fa\)"):
        check_run_info(tmp_path, with_input_digests({"command": "eval", "set": "cameo139"}, {"--calib": calib}))


def test_a_done_rows_replaced_output_is_redone_and_an_older_table_resumes(tmp_path, capsys):
    """The row records its file's sha256: another map copied over it (same shape) is redone, not kept. A table of
    an older release (no output_sha256 column) still resumes."""
    import numpy as np

    from ptq_protein.cli.main import main

    out = tmp_path / "out"
    argv = ["eval", "contacts", "--model", "tiny-esm2", "--recipes", "fp", "--set", "cameo139:1", "--quiet",
            "--out", str(out), "--json"]
    assert main(argv) == 0
    (npy,) = (out / "contacts" / "fp").glob("*.npy")
    original = npy.read_bytes()
    np.save(npy, np.zeros_like(np.load(npy)))  # another model's map: same name, same shape
    capsys.readouterr()
    assert main(argv) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts["ok"] == 1 and counts["resumed"] == 0 and npy.read_bytes() == original
    with open(out / "results.csv", newline="") as handle:
        rows = [{k: v for k, v in row.items() if k != "output_sha256"} for row in csv.DictReader(handle)]
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["resumed"] == 1
