"""``fold`` refuses what it can before the model loads (minutes for a 3B ESMFold): an all-X sequence, ``--out`` a
file, a PDB path that is a folder (with or without ``--force``), a rerun without ``--force``, a ``--max-memory``
already spent; a sequence it refuses is not first announced as "folding it anyway"."""

import json
import logging

import pytest

from ptq_protein.cli import fold_cmd
from ptq_protein.cli.main import main

FASTA = ">ok\nMKTAYIAKQRQ\n"


def fold(capsys, fasta, out, *extra):
    capsys.readouterr()
    try:
        code = main(["fold", "tiny-esmfold", "--fasta", str(fasta), "--out", str(out), "--quiet", *extra])
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err.strip()


@pytest.fixture()
def fasta(tmp_path):
    path = tmp_path / "x.fasta"
    path.write_text(FASTA)
    return path


@pytest.fixture()
def no_load(monkeypatch):
    monkeypatch.setattr(fold_cmd, "load_model_or_artifact", lambda *a, **k: pytest.fail("the model was loaded"))


def test_an_all_x_sequence_is_refused_before_the_model_loads(tmp_path, capsys, no_load):
    path = tmp_path / "x.fasta"
    path.write_text(">allx\nXXXXXXXXXXXX\n>ok\nMKTAYIAKQRQ\n")
    code, err = fold(capsys, path, tmp_path / "o")
    assert code == 2 and len(err.splitlines()) == 1 and "'allx' has no residue ESMFold knows" in err
    assert not (tmp_path / "o" / "fold_index.json").exists()


@pytest.mark.parametrize("case", ["out is a file", "pdb is a folder", "rerun", "force and pdb is a folder",
                                  "max memory"])
def test_refused_before_the_model_loads(tmp_path, fasta, capsys, monkeypatch, case):
    out = tmp_path / "o"
    extra = []
    if case == "out is a file":
        out.write_text("mine")
    elif case == "max memory":
        extra = ["--max-memory", "1M"]
    else:
        assert fold(capsys, fasta, out)[0] == 0
        if case != "rerun":
            (out / "ok.pdb").unlink()
            (out / "ok.pdb").mkdir()
        extra = ["--force"] if case.startswith("force") else []
    monkeypatch.setattr(fold_cmd, "load_model_or_artifact", lambda *a, **k: pytest.fail("the model was loaded"))
    code, err = fold(capsys, fasta, out, *extra)
    assert code == 2 and len(err.splitlines()) == 1, err
    words = {"out is a file": "is a regular file, not a folder", "pdb is a folder": "ok.pdb is a folder",
             "force and pdb is a folder": "ok.pdb is a folder", "rerun": "ok.pdb already exists",
             "max memory": "--max-memory"}[case]
    assert words in err


def test_a_refused_long_sequence_is_not_announced_as_folded(tmp_path, capsys, monkeypatch, caplog):
    from ptq_protein.eval.bench import fold_budget

    path = tmp_path / "x.fasta"
    path.write_text(">long\n" + "M" * 1100 + "\n>ok\nMKTAYIAKQRQ\n")

    def refuse_long(model, sequence, *args, **kwargs):
        if len(sequence) > 1022:
            raise fold_budget.FoldRefused("needs more than the budget")
        return real(model, sequence, *args, **kwargs)

    from ptq_protein.eval.bench import folding

    real = folding.fold_output
    monkeypatch.setattr(folding, "fold_output", refuse_long)
    with caplog.at_level(logging.INFO):
        code, err = fold(capsys, path, tmp_path / "o")
    assert code == 2 and "not folded: long" in err and "trained on at most" not in err + caplog.text
    assert json.loads((tmp_path / "o" / "fold_index.json").read_text()) == {"ok": "ok.pdb"}
