"""``ptq-protein sensitivity`` and ``quantize --auto``: outputs, resume, and one-line exit-2 errors."""

import json

import pytest

from ptq_protein.cli.main import main


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sensitivity_cli_writes_csv_summary_plot_and_resumes(tmp_path, capsys):
    out = tmp_path / "sens"
    argv = ("sensitivity", "tiny-esm2", "--recipe", "w8a8-uniform", "--set", "cameo139:2", "--metric", "logits",
            "--unit", "layer", "--calib", "casp14:3", "--calib-max-length", "64", "--out", str(out), "--json")
    code, stdout, err = _run(capsys, *argv)
    assert code == 0, err
    result = json.loads(stdout)
    assert {"csv", "summary", "plot"} <= set(result["paths"]) and (out / "sensitivity.csv").exists()
    rows = (out / "sensitivity.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 and rows[0].startswith("rank,unit,kind,layer,part")
    code, _, err = _run(capsys, *argv)  # resumes: same table
    assert code == 0, err and (out / "sensitivity.csv").read_text().splitlines() == rows


@pytest.mark.parametrize("argv,message", [
    (("quantize", "tiny-esm2", "--auto", "--budget", "tm>0.99"), "not understood"),
    (("quantize", "tiny-esm2", "--auto", "--budget", "tm>=0.9", "--calib", "casp14:2"), "needs a folding model"),
    (("quantize", "tiny-esm2", "--budget", "tm>=0.9"), "need --auto"),
    (("quantize", "tiny-esm2", "--auto", "--max-bits-avg", "40"), "between 2 and 16"),
    (("quantize", "tiny-esm2", "--auto", "--budget", "logits_rel<=0.0000001", "--unit", "part", "--calib", "casp14:2",
      "--search-set", "cameo139:1", "--holdout", "cameo2022:1", "--calib-max-length", "48"), "best reached is"),
    (("sensitivity", "tiny-esm2", "--metric", "tm", "--calib", "casp14:2"), "needs a folding model"),
    (("sensitivity", "tiny-esm2", "--recipe", "w9a9", "--metric", "logits"), "unknown preset"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    code, _, err = _run(capsys, *argv, "--out", str(out))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
