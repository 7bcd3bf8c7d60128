"""``ptq-protein tmscore | lddt | contacts``: output, JSON, and one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_testlib import FULL_NATIVE, STRUCTURES

from ptq_protein.cli.main import main
from ptq_protein.eval.contacts import contact_map
from ptq_protein.eval.tmscore import tm_score

MODEL = STRUCTURES / "noise_7TV9_3.model.pdb.gz"
NATIVE = STRUCTURES / "7TV9.native.pdb.gz"


def _run(capsys, *argv) -> tuple:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tmscore_json_matches_the_api(capsys):
    code, out, _ = _run(capsys, "tmscore", MODEL, NATIVE, "--json")
    assert code == 0
    data = json.loads(out)
    expected = tm_score(MODEL, NATIVE).to_dict()
    assert {k: data[k] for k in expected} == pytest.approx(expected)
    assert data["pairing"] == "number"


def test_tmscore_table_and_sequence_pairing(capsys, golden):
    case = next(c for c in golden["cases"] if c["id"] == "eigenfold_7r49.B")
    code, out, _ = _run(capsys, "tmscore", STRUCTURES / case["model"], STRUCTURES / case["native"],
                        "--pairing", "sequence")
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("TM-score"))
    assert float(line.split()[1]) == pytest.approx(case["tmscore"]["tm_score"], abs=1e-4)


def test_tmscore_tm_normalize_sequence(capsys):
    """A full-sequence prediction exact on 96 of 164 observed residues: 96/164 by the sequence."""
    model, native = STRUCTURES / "exact_8ds5.A.model.pdb.gz", STRUCTURES / "8ds5.A.native.pdb.gz"
    code, out, _ = _run(capsys, "tmscore", model, native, "--pairing", "sequence", "--tm-normalize", "sequence",
                        "--json")
    assert code == 0
    data = json.loads(out)
    assert data["tm_normalize"] == "sequence" and data["length"] == 164
    assert data["tm_score"] == pytest.approx(96 / 164, abs=1e-9)
    code, out, _ = _run(capsys, "tmscore", model, native, "--pairing", "sequence")
    assert code == 0 and "96 (the native's residues" in out
    with pytest.raises(SystemExit) as exit_info:  # argparse: usage line + one error line
        _run(capsys, "tmscore", model, native, "--tm-normalize", "model")
    assert exit_info.value.code == 2 and "invalid choice: 'model'" in capsys.readouterr().err


def test_lddt_json_and_per_residue(capsys):
    code, out, _ = _run(capsys, "lddt", FULL_NATIVE, FULL_NATIVE, "--json", "--per-residue")
    data = json.loads(out)
    assert code == 0 and data["lddt"] == 1.0 and data["mode"] == "all" and len(data["per_residue"]) == 63
    code, out, _ = _run(capsys, "lddt", MODEL, NATIVE, "--per-residue")
    assert code == 0 and out.startswith("lDDT") and len(out.splitlines()) == 64


def test_contacts_from_npy(capsys, tmp_path, full_native):
    pred = tmp_path / "pred.npy"
    np.save(pred, contact_map(full_native).astype(np.float32))
    code, out, _ = _run(capsys, "contacts", pred, FULL_NATIVE, "--json")
    data = json.loads(out)
    assert code == 0 and len([k for k in data if "@" in k or "AUC" in k]) == 16
    fasta = tmp_path / "query.fasta"
    fasta.write_text(f">q\n{full_native.sequence}\n")
    code, out, _ = _run(capsys, "contacts", pred, FULL_NATIVE, "--sequence", fasta)
    assert code == 0 and out.splitlines()[0].split() == ["range", "P@L", "P@L2", "P@L5", "AUC"]


def test_errors_are_one_line_with_exit_code_2(capsys, tmp_path):
    code, _, err = _run(capsys, "tmscore", MODEL, NATIVE, "--chain", "Q")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no chain 'Q'" in err
    code, _, err = _run(capsys, "tmscore", tmp_path / "nope.pdb", NATIVE)
    assert code == 2 and "not found" in err
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((5, 7)))
    code, _, err = _run(capsys, "contacts", bad, NATIVE)
    assert code == 2 and "square" in err
    pickled = tmp_path / "obj.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    code, _, err = _run(capsys, "contacts", pickled, NATIVE)
    assert code == 2 and len(err.strip().splitlines()) == 1
