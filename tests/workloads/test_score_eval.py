"""``eval variants``: drift of quantized scores from FP, Spearman vs a DMS, refusals before the model loads."""

import csv
import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from ptq_protein.cli.main import main
from ptq_protein.data.sets import BenchmarkSet, Target
from ptq_protein.eval.bench.dms_assays import load_assays
from ptq_protein.eval.bench.runner import RunOptions
from ptq_protein.eval.bench.variants_task import VariantOptions, evaluate_variants
from ptq_protein.eval.rank_correlation import spearman
from ptq_protein.workloads.mutants import parse_mutant
from ptq_protein.workloads.variant_scores import score_mutants

TARGETS = {"p1": "MKTAYIAKQRQISFVKSHF", "p2": "GSHMLEDPVAGVSKEELLK"}
DMS = "mutant,DMS_score\nM1A,0.3\nK2W,-1.0\nT3G,\nA4C:Q9E,-2.5\nI6V,0.9\nF19L,0.1\nS17P,-0.4\n"
PWLQ_DRIFT_BOUND = 0.995  # measured 0.99981 (p1) and 0.99964 (p2) on tiny-esm2 seed 0, masked-marginals


def bench(ids=("p1", "p2")) -> BenchmarkSet:
    return BenchmarkSet("t", tuple(Target(i, TARGETS[i]) for i in ids))


@pytest.fixture(scope="module")
def run(tmp_path_factory, esm2):
    """fp and w8a8-pwlq over both targets, with a DMS assay for p1 (one evaluation for the module's tests)."""
    out = tmp_path_factory.mktemp("variants")
    (out.parent / "dms").mkdir(exist_ok=True)
    (out.parent / "dms" / "p1.csv").write_text(DMS)
    assays = load_assays(out.parent / "dms", bench())
    options = RunOptions(calibration=list(TARGETS.values()))
    result = evaluate_variants(esm2, bench(), ["fp", "w8a8-pwlq"], out, options, VariantOptions(), assays)
    with open(result["results"], newline="") as handle:
        rows = {(r["recipe"], r["target"]): r for r in csv.DictReader(handle)}
    return out, result, rows


def test_fp_agrees_with_itself_and_w8a8_pwlq_drifts_little(run):
    out, result, rows = run
    assert result["counts"]["ok"] == 4
    for target, sequence in TARGETS.items():
        assert float(rows["fp", target]["spearman_vs_fp"]) == 1.0
        drift = float(rows["w8a8-pwlq", target]["spearman_vs_fp"])
        assert PWLQ_DRIFT_BOUND < drift < 1.0
        fp, q = (np.load(out / rows[r, target]["variants"]) for r in ("fp", "w8a8-pwlq"))
        changed = np.array([[aa != wt for aa in "ACDEFGHIKLMNPQRSTVWY"] for wt in sequence])
        assert changed.sum() == 19 * len(sequence)
        assert drift == pytest.approx(spearmanr(q[changed], fp[changed])[0], abs=1e-6)


def test_the_dms_column_equals_scipy_on_the_models_own_scores(run, esm2):
    out, _, rows = run
    mutants = [line.split(",")[0] for line in DMS.splitlines()[1:]]
    measured = [float(line.split(",")[1] or "nan") for line in DMS.splitlines()[1:]]
    mine = score_mutants(esm2, TARGETS["p1"], [parse_mutant(m, TARGETS["p1"]) for m in mutants], "masked-marginals")
    keep = [i for i, v in enumerate(measured) if not math.isnan(v)]
    want = spearmanr([mine[i] for i in keep], [measured[i] for i in keep])[0]
    assert float(rows["fp", "p1"]["spearman_vs_dms"]) == pytest.approx(want, abs=1e-6)
    assert rows["fp", "p1"]["n_dms"] == "6" and rows["w8a8-pwlq", "p1"]["spearman_vs_dms"] != ""
    assert rows["fp", "p2"]["spearman_vs_dms"] == ""  # no assay for p2
    grid = np.load(out / rows["fp", "p1"]["variants"])
    assert grid.shape == (19, 20) and grid[0, "ACDEFGHIKLMNPQRSTVWY".index("M")] == 0.0
    summary = (out / "summary.md").read_text()
    assert "## Spearman vs DMS_score" in summary and "Spearman vs FP scores" in summary
    assert (out / "fp_vs_quantized.png").stat().st_size > 1000


def test_a_rerun_resumes_and_another_strategy_is_refused(run, esm2):
    out, _, _ = run
    assays = load_assays(out.parent / "dms", bench())
    options = RunOptions(calibration=list(TARGETS.values()))
    again = evaluate_variants(esm2, bench(), ["fp", "w8a8-pwlq"], out, options, VariantOptions(), assays)
    assert again["counts"]["resumed"] == 4 and again["counts"]["ok"] == 0
    with pytest.raises(ValueError, match="strategy"):
        evaluate_variants(esm2, bench(), ["fp"], out, options, VariantOptions("wt-marginals"), assays)


def test_spearman_against_the_closed_form_without_ties():
    rng = np.random.default_rng(0)
    x, y = rng.permutation(12).astype(float), rng.permutation(12).astype(float)
    d = x - y  # permutations of 0..11 are their own ranks
    assert spearman(x, y) == pytest.approx(1 - 6 * (d ** 2).sum() / (12 * (12 ** 2 - 1)), abs=1e-12)
    assert spearman([1, 2, float("nan"), 4], [1, 2, 9, 4]) == pytest.approx(1.0)  # the NaN pair is dropped
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3])) and math.isnan(spearman([1, 2], [2, 1]))


def eval_variants(*args) -> int:
    return main(["eval", "variants", "--model", "tiny-esm2", *map(str, args), "--quiet"])


def test_the_cli_scores_a_one_target_set_with_its_dms_file(tmp_path, capsys):
    fasta, dms = tmp_path / "p1.fasta", tmp_path / "p1.csv"
    fasta.write_text(f">p1\n{TARGETS['p1']}\n")
    dms.write_text(DMS)
    assert eval_variants("--set", fasta, "--recipes", "fp", "--dms", dms, "--strategy", "wt-marginals",
                         "--out", tmp_path / "o") == 0
    with open(tmp_path / "o" / "results.csv", newline="") as handle:
        (row,) = csv.DictReader(handle)
    assert row["recipe"] == "fp" and float(row["spearman_vs_fp"]) == 1.0 and row["n_dms"] == "6"


@pytest.mark.parametrize("dms_text, words", [
    ("mutant,DMS_score\nM1A,1\nA2G,2\n", "line 3: mutant 'A2G': the sequence has 'K' at position 2"),
    ("mutant,fitness\nM1A,1\n", "has no column 'DMS_score'"),
    ("mutant,DMS_score\nM1A,\n", "no row has a number in DMS_score"),
])
def test_bad_dms_files_are_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, dms_text, words):
    from ptq_protein.cli import eval_cmd

    monkeypatch.setattr(eval_cmd, "load_float_model", lambda *a, **k: pytest.fail("the model was loaded"))
    fasta, dms = tmp_path / "p1.fasta", tmp_path / "p1.csv"
    fasta.write_text(f">p1\n{TARGETS['p1']}\n")
    dms.write_text(dms_text)
    assert eval_variants("--set", fasta, "--dms", dms, "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_one_dms_file_for_a_set_of_two_is_refused(tmp_path, capsys):
    fasta, dms = tmp_path / "two.fasta", tmp_path / "p1.csv"
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in TARGETS.items()))
    dms.write_text(DMS)
    assert eval_variants("--set", fasta, "--dms", dms, "--out", tmp_path / "o") == 2
    assert "the set has 2 targets" in capsys.readouterr().err
