"""``ptq-protein score``: DMS rows and every single mutant, models and artifacts, refusals before the model loads."""

import csv
from pathlib import Path

import pytest
import torch

from ptq_protein.cli.main import main
from ptq_protein.workloads.mutants import parse_mutant
from ptq_protein.workloads.variant_scores import score_mutants

SEQ = "MKTAYIAKQRQISFVKSHF"
DMS = 'mutant,DMS_score,note\nM1A,0.5,"a, quoted"\nK2W:F19Y,-1.25,\nT3T,,x\n'


def score(*args) -> int:
    try:
        return main(["score", *map(str, args), "--quiet"])
    except SystemExit as stop:  # argparse's refusals
        return stop.code


def read(path: Path):
    with open(path, newline="") as handle:
        return list(csv.reader(handle))


@pytest.fixture()
def dms(tmp_path) -> Path:
    path = tmp_path / "dms.csv"
    path.write_text(DMS)
    return path


@pytest.mark.parametrize("strategy", ["wt-marginals", "masked-marginals", "pseudo-ppl"])
def test_dms_rows_come_back_with_one_score_column(tmp_path, dms, esm2, strategy):
    out = tmp_path / "scored.csv"
    assert score("tiny-esm2", "--sequence", SEQ, "--dms", dms, "--strategy", strategy, "--out", out) == 0
    rows = read(out)
    assert rows[0] == ["mutant", "DMS_score", "note", f"tiny-esm2_{strategy}"]
    assert [r[:3] for r in rows[1:]] == [r for r in read(dms)[1:]]  # every cell as it was
    assert dms.read_text() == DMS  # the input is never written
    want = score_mutants(esm2, SEQ, [parse_mutant(m, SEQ) for m in ("M1A", "K2W:F19Y", "T3T")], strategy)
    got = torch.tensor([float(r[3]) for r in rows[1:]])
    torch.testing.assert_close(got, torch.tensor(want), atol=2e-6, rtol=1e-5)  # the CLI's SDPA: float rounding


def test_every_single_mutant_and_a_heatmap(tmp_path, esm2):
    out = tmp_path / "singles.csv"
    assert score("tiny-esm2", "--sequence", SEQ[:8], "--out", out, "--score-col", "s") == 0
    rows = read(out)
    assert rows[0] == ["mutant", "s"] and len(rows) - 1 == 19 * 8
    assert rows[1][0] == "M1A" and rows[-1][0] == "K8Y" and "K8K" not in {r[0] for r in rows}
    for suffix in (".png", ".pdf", ".svg"):
        assert out.with_suffix(suffix).stat().st_size > 1000
    want = score_mutants(esm2, SEQ[:8], [parse_mutant(r[0], SEQ[:8]) for r in rows[1:]], "masked-marginals")
    got = torch.tensor([float(r[1]) for r in rows[1:]])
    torch.testing.assert_close(got, torch.tensor(want), atol=2e-6, rtol=1e-5)  # the CLI's SDPA: float rounding


def test_without_matplotlib_the_csv_is_written_and_the_figure_skipped(tmp_path, monkeypatch, caplog):
    from ptq_protein.workloads import score_job

    monkeypatch.setattr(score_job, "can_plot", lambda: False)
    out = tmp_path / "singles.csv"
    assert score("tiny-esm2", "--sequence", "MKT", "--out", out) == 0
    assert len(read(out)) == 1 + 19 * 3 and not out.with_suffix(".png").exists()
    assert "heatmap is skipped" in caplog.text


@pytest.mark.parametrize("model", ["tiny-esm2-hf", "artifact-fake", "artifact-int8"])
def test_transformers_models_and_artifacts(tmp_path, dms, artifact, model):
    args = ["tiny-esm2-hf"] if model == "tiny-esm2-hf" else [artifact, "--backend", model.split("-")[1]]
    out = tmp_path / "scored.csv"
    assert score(*args, "--sequence", SEQ, "--dms", dms, "--out", out) == 0
    rows = read(out)
    name = "tiny-esm2-hf" if model == "tiny-esm2-hf" else "w8a8"  # an artifact saved without its source's name
    assert rows[0][-1] == f"{name}_masked-marginals" and len(rows) == 4
    assert all(r[-1] for r in rows[1:])


def test_an_existing_out_is_replaced_only_with_force(tmp_path, dms, capsys):
    out = tmp_path / "scored.csv"
    out.write_text("keep me\n")
    assert score("tiny-esm2", "--sequence", SEQ, "--dms", dms, "--out", out) == 2
    assert "already exists" in capsys.readouterr().err and out.read_text() == "keep me\n"
    assert score("tiny-esm2", "--sequence", SEQ, "--dms", dms, "--out", out, "--force") == 0
    assert read(out)[0][0] == "mutant"


BAD = [
    (["--strategy", "best"], "invalid choice: 'best'"),
    (["--dms", "{bad_letter}"], "'J' is not an amino-acid letter"),
    (["--dms", "{out_of_range}"], "position 20 is outside the sequence"),
    (["--dms", "{mismatch}"], "line 3: mutant 'A2G': the sequence has 'K' at position 2"),
    (["--dms", "{dms}", "--offset-idx", "0"], "has 'K' at position 1, not 'M'"),
    (["--dms", "{dms}", "--mutation-col", "variant"], "has no column 'variant'"),
    (["--dms", "{dms}", "--sequence", "MKTAYJ"], "invalid letter 'J' at position 6"),
    (["--dms", "{dms}", "--out", "{file}/x.csv"], "is a regular file, not a folder"),
    (["--dms", "{dms}", "--out", "{dms}"], "is the DMS input file"),
    (["--dms", "{dms}", "--score-col", "note"], "already has a column 'note'"),
    (["--toks-per-batch", "0"], "--toks-per-batch 0 must be a positive number"),
]


@pytest.mark.parametrize("extra, words", BAD, ids=[w for _, w in BAD])
def test_bad_input_is_one_line_before_the_model_loads(tmp_path, dms, extra, words, capsys, monkeypatch):
    from ptq_protein.cli import score_cmd

    monkeypatch.setattr(score_cmd, "load_model_or_artifact", lambda *a: pytest.fail("the model was loaded"))
    files = {"bad_letter": "mutant\nM1J\n", "out_of_range": "mutant\nF20A\n", "mismatch": "mutant\nM1A\nA2G\n"}
    paths = {"dms": dms, "file": dms}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name}.csv"
        paths[name].write_text(text)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = ["--sequence", SEQ, "--out", tmp_path / "o.csv"] + [str(a).format(**paths) for a in extra]
    assert score("tiny-esm2", *args) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before and dms.read_text() == DMS


def test_an_unwritable_out_folder_is_refused(tmp_path, dms, capsys, monkeypatch):
    import ptq_protein.support.io_utils

    locked = tmp_path / "locked"
    locked.mkdir()
    # as a non-root user sees 0o500
    monkeypatch.setattr(ptq_protein.support.io_utils.os, "access", lambda *a, **k: False)
    assert score("tiny-esm2", "--sequence", SEQ, "--dms", dms, "--out", locked / "o.csv") == 2
    assert "does not take new files" in capsys.readouterr().err and not list(locked.iterdir())


def test_a_homopolymer_dms_says_the_offset_is_unconfirmed(tmp_path, caplog):
    """Every mutant inside a run: a wrong --offset-idx passed the wild-type check without a word."""
    path = tmp_path / "runs.csv"
    path.write_text("mutant,DMS_score\nK4A,0.1\nA8G,0.2\n")
    seq = "MKKKKKAAAAAW"
    with caplog.at_level("WARNING"):
        assert score("tiny-esm2", "--sequence", seq, "--dms", path, "--out", tmp_path / "o.csv") == 0
    assert "also matches with --offset-idx -1 or 0 or 2" in caplog.text
    assert "cannot confirm --offset-idx 1" in caplog.text
    caplog.clear()
    path.write_text("mutant,DMS_score\nK2A,0.1\nW12G,0.2\n")
    with caplog.at_level("WARNING"):
        assert score("tiny-esm2", "--sequence", seq, "--dms", path, "--out", tmp_path / "p.csv") == 0
    assert "cannot confirm" not in caplog.text
