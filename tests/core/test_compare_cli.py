"""``quantize``'s fidelity check: median-length sequences, ``--compare`` from one calibration pass, its table."""

import json
import random
import re

import pytest
import torch

from ptq_protein.cli import compare_table
from ptq_protein.cli.main import main
from ptq_protein.eval.bench.fidelity import fidelity_sequences


def _cells(line):
    """A table line's cells: columns are two or more spaces apart (the bits cell may hold one space)."""
    return re.split(r"\s{2,}", line.strip())


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fidelity_sequences_are_never_the_shortest_when_longer_exist():
    rng = random.Random(0)
    for _ in range(500):
        total = rng.randint(1, 30)
        lengths = rng.sample(range(20, 1000), total)  # distinct lengths
        n = rng.randint(1, 6)
        picked = fidelity_sequences(lengths, n)
        chosen = sorted(lengths[i] for i in picked)
        ordered = sorted(lengths)
        assert len(set(picked)) == len(picked) == min(n, total)
        if total > n:
            assert chosen != ordered[:n], (lengths, n)  # a longer one exists: not the shortest few
        median = (ordered[(total - 1) // 2] + ordered[total // 2]) / 2
        assert chosen[0] <= median <= chosen[-1] or len(chosen) == 1 and abs(chosen[0] - median) <= \
            min(abs(v - median) for v in ordered)
    casp = [32, 35, 74, 95, 98, 100, 172, 186, 190, 949]
    assert sorted(casp[i] for i in fidelity_sequences(casp, 3)) == [98, 100, 172]
    with pytest.raises(ValueError, match="at least 1"):
        fidelity_sequences(casp, 0)


def test_quickstart_demo_prints_the_comparison_from_one_calibration_pass(tmp_path, capsys, calibration_counter):
    code, out, err = _run(capsys, "quantize", "tiny-esmfold", "--bits", "8", "--calib", "casp14:6",
                          "--num-recycles", "0", "--check", "2", "--out", str(tmp_path / "a"))
    assert code == 0, err
    assert calibration_counter["passes"] == 1  # the demo's w8a8-pwlq and w8a8-uniform share the pass (bf16-trunk
    # calibrates nothing)
    # ESMFold calibrates one sequence a forward, as the study's pass does: the study recipe of the default
    # comparison keeps its own statistics, observed in those same 6 forwards, and says so
    assert calibration_counter["forwards"] == 6
    assert "note: study-w8a8-pwlq keeps the study's own statistics (batch 1, first calls, BOS/EOS included), " \
           "observed in the forwards of the pass of w8a8-pwlq, w8a8-uniform" in out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("fidelity vs the FP model"))
    assert "toolkit check, random weights" in lines[head]
    assert lines[head + 1].startswith("on the 2 median-length calibration sequences of 6 (")
    assert lines[head + 2].split() == ["recipe", "bits", "W/A", "rel.", "error", "TM", "vs", "FP"]
    rows = [_cells(line) for line in lines[head + 3:head + 7]]
    assert [r[:2] for r in rows] == [["bf16-trunk", "fp/fp, trunk bf16"], ["w8a8-pwlq", "8/8"],
                                     ["w8a8-uniform", "8/8"], ["study-w8a8-pwlq", "8/9"]]
    for row in rows:
        rel, tm = float(row[2]), float(row[3])
        assert 0 <= rel < 1 and 0 < tm <= 1
    # the artifact does not depend on what it is compared with
    code, _, err = _run(capsys, "quantize", "tiny-esmfold", "--bits", "8", "--calib", "casp14:6",
                        "--num-recycles", "0", "--check", "0", "--compare", "none", "--out", str(tmp_path / "b"))
    assert code == 0, err
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "a" / "report.json").read_bytes() == (tmp_path / "b" / "report.json").read_bytes()


def test_compare_json_carries_the_table_and_skips_unknown_recipes(tmp_path, capsys, calibration_counter, monkeypatch):
    monkeypatch.setattr(compare_table, "DEMO_COMPARE", ("w8a8-uniform", "study-not-here"))
    code, out, err = _run(capsys, "quantize", "tiny-esm2", "--preset", "w8a8-pwlq", "--calib", "casp14:5", "--check",
                          "2", "--json", "--out", str(tmp_path / "a"))
    assert code == 0, err
    comparison = json.loads(out)["comparison"]
    assert comparison["skipped"] == ["study-not-here"]
    assert [r["recipe"] for r in comparison["rows"]] == ["w8a8-pwlq", "w8a8-uniform"]
    assert all(0 <= r["top1_agreement"] <= 1 and r["weight_bits"] == 8 for r in comparison["rows"])
    assert comparison["calibration"] == {"passes": 1, "notes": {}}
    assert calibration_counter["passes"] == 1
    seqs = comparison["sequences"]
    assert len(seqs["ids"]) == 2 and seqs["lengths"] == [min(128, n) for n in seqs["full_lengths"]]

    code, out, err = _run(capsys, "quantize", "tiny-esm2", "--preset", "w8a8-pwlq", "--calib", "casp14:5", "--check",
                          "1", "--json", "--compare", "none", "--out", str(tmp_path / "b"))
    assert code == 0, err
    assert [r["recipe"] for r in json.loads(out)["comparison"]["rows"]] == ["w8a8-pwlq"]


def test_compare_without_the_check_is_refused(tmp_path, capsys):
    code, _, err = _run(capsys, "quantize", "tiny-esm2", "--check", "0", "--compare", "w8a8-uniform",
                        "--out", str(tmp_path / "a"))
    assert code == 2 and "--check" in err and len(err.strip().splitlines()) == 1


def test_readme_quickstart_output_is_the_printed_format(capsys):
    """README's example block is exactly what print_comparison writes for the numbers it shows."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    marker = "fidelity vs the FP model ("
    block = marker + readme.split(marker, 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    ids = lines[1].split("(", 1)[1].split(";", 1)[0].split(", ")
    table = [line for line in lines[3:] if not line.lstrip().startswith("note:")]
    notes = [line.split("note: ", 1)[1] for line in lines[3:] if line.lstrip().startswith("note:")]
    verdicts = {n.split("'s ", 1)[0]: n.split("(", 1)[1].rsplit(")", 1)[0] for n in notes if "is far outside" in n}
    notes = dict(n.split(" ", 1) for n in notes if "is far outside" not in n)
    rows = [_cells(line.split("  << outside")[0]) for line in table]

    def width(text):
        return None if text == "fp" else int(text)

    def trunk(cell):
        return {"trunk_dtype": "bfloat16"} if cell.endswith(", trunk bf16") else {}

    comparison = {
        "sequences": {"source": "the 3 median-length calibration sequences of 50", "ids": ids,
                      "lengths": [128] * 3, "full_lengths": [200] * 3},
        "rows": [{"recipe": r[0], "weight_bits": width(r[1].split(",")[0].split("/")[0]),
                  "activation_bits": width(r[1].split(",")[0].split("/")[1]), **trunk(r[1]),
                  "relative_error": float(r[2]), "tm_vs_fp": float(r[3]),
                  **({"verdict": {"within": False, "outside": [verdicts[r[0]]], "bound": {"bits": 8}}}
                     if r[0] in verdicts else {})} for r in rows],
        "calibration": {"passes": 1, "notes": notes},
    }
    compare_table.print_comparison(comparison, demo=True)
    assert capsys.readouterr().out == block


@pytest.mark.parametrize("argv, words", [
    (["--compare", "w8a8-uniformm"], "did you mean 'w8a8-uniform'"),
    (["--compare", "study-w8a8-pwlq", "--backend", "int8"], "study-* recipes simulate in float"),
    (["--preset", "w4a8-pwlq", "--backend", "int8", "--compare", "none"], None),
    (["--auto", "--budget", "logits_rel<=0.5", "--compare", "w8a8-uniform"], "--compare does not apply with --auto"),
])
def test_bad_combinations_are_refused_before_any_work(tmp_path, capsys, calibration_counter, argv, words):
    """Every recipe is checked with --backend before the model loads.

    Exit 2, one line, nothing calibrated or written.
    """
    code, _, err = _run(capsys, "quantize", "tiny-esm2", "--calib", "casp14:3", *argv, "--out", str(tmp_path / "a"))
    if words is None:  # a combination that is fine must still run
        assert code == 0, err
        return
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert calibration_counter["passes"] == 0 and not (tmp_path / "a").exists()


def test_a_compared_recipe_that_selects_nothing_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """It failed after the main recipe was calibrated, quantized and saved (minutes on a real model), exit 2."""
    from ptq_protein.workflows import shared_calibration

    monkeypatch.setattr(shared_calibration, "calibrate_recipes", lambda *a, **k: pytest.fail("calibrated"))
    code = main(["quantize", "tiny-esm2", "--preset", "w8a8-uniform", "--compare", "study-a8-pwlq-esm",
                 "--calib", "casp14:2", "--out", str(tmp_path / "a"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--compare study-a8-pwlq-esm" in err[0] and "selects no site" in err[0]
    assert not (tmp_path / "a").exists()


def test_the_bits_cell_says_the_trunk_runs_in_bfloat16():
    """bf16-trunk quantizes nothing, yet is not the float model: its cell says so; other rows keep their widths."""
    comparison = {"sequences": {"source": "s", "ids": ["a"], "lengths": [9], "full_lengths": [9]},
                  "rows": [{"recipe": "bf16-trunk", "weight_bits": None, "activation_bits": None,
                            "trunk_dtype": "bfloat16", "relative_error": 0.002, "tm_vs_fp": 1.0},
                           {"recipe": "w8a8-pwlq-stem", "weight_bits": 8, "activation_bits": 8,
                            "trunk_dtype": "bfloat16", "relative_error": 0.01, "tm_vs_fp": 0.99},
                           {"recipe": "w8a8-pwlq", "weight_bits": 8, "activation_bits": 8,
                            "relative_error": 0.03, "tm_vs_fp": 0.98}],
                  "calibration": {"notes": {}}}
    lines = compare_table.comparison_lines(comparison, demo=False)
    rows = [_cells(line) for line in lines[3:]]
    assert [r[1] for r in rows] == ["fp/fp, trunk bf16", "8/8, trunk bf16", "8/8"]
    assert len({len(line) for line in lines[3:]}) == 1  # one column width for every row


def test_a_rows_trunk_dtype_comes_from_its_recipe():
    from ptq_protein.recipes.presets import get_preset
    from ptq_protein.workflows.recipe_compare import ComparisonRow

    assert get_preset("bf16-trunk").trunk_dtype == "bfloat16"
    row = ComparisonRow("bf16-trunk", None, None, {"relative_error": 0.0}, None, "bfloat16").to_dict()
    assert row["trunk_dtype"] == "bfloat16"
    assert "trunk_dtype" not in ComparisonRow("w8a8-pwlq", 8, 8, {}).to_dict()  # absent: as before
