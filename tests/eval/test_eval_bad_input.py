"""Bad structure input: each case is a clear error or a documented result, never a silent 0 or a crash."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from eval_testlib import ca_residues, pdb_lines, random_walk

from ptq_protein.eval.contacts import contact_precision
from ptq_protein.eval.lddt import lddt
from ptq_protein.eval.structure import load_structure
from ptq_protein.eval.tmscore import tm_score
from ptq_protein.support.errors import InputError


def _text(lines: list) -> str:
    return "\n".join(lines) + "\nEND\n"


def test_no_ca_atoms_is_an_error():
    residues = [("GLY", i + 1, "", [("N", xyz), ("C", xyz + 1.0)]) for i, xyz in enumerate(random_walk(5, seed=0))]
    with pytest.raises(InputError, match="no CA atoms"):
        load_structure(_text(pdb_lines(residues)))


def test_no_residues_in_common_is_an_error():
    model = _text(pdb_lines(ca_residues(random_walk(20, seed=1), start=1)))
    native = _text(pdb_lines(ca_residues(random_walk(20, seed=2), start=101)))
    with pytest.raises(InputError, match="no residues with CA in common.*pairing='sequence'"):
        tm_score(model, native)
    with pytest.raises(InputError, match="no residues in common"):
        lddt(model, native)


def test_several_chains_default_to_the_first_and_can_be_chosen(caplog):
    a, b = random_walk(30, seed=3), random_walk(40, seed=4)
    text = _text(pdb_lines(ca_residues(a), chain="A") + ["TER"] + pdb_lines(ca_residues(b), chain="B"))
    with caplog.at_level(logging.INFO, logger="ptq_protein.eval.structure"):
        first = load_structure(text)
    assert (first.chain_id, len(first)) == ("A", 30)
    assert "using the first" in caplog.text
    second = load_structure(text, chain="B")
    assert (second.chain_id, len(second)) == ("B", 40)
    with pytest.raises(InputError, match="no chain 'Z'.*\\['A', 'B'\\]"):
        load_structure(text, chain="Z")
    assert tm_score(text, text, model_chain="B", native_chain="B").length == 40


def test_several_models_use_the_first():
    a, b = random_walk(25, seed=5), random_walk(25, seed=6)
    text = "\n".join(["MODEL        1", *pdb_lines(ca_residues(a)), "ENDMDL", "MODEL        2",
                      *pdb_lines(ca_residues(b)), "ENDMDL", "END"]) + "\n"
    s = load_structure(text)
    np.testing.assert_allclose(s.ca, np.round(a, 3), atol=1e-3)


def test_hetatm_only_file_is_an_error():
    ligand = [("ATP", 1, "", [("PA", (0.0, 0.0, 0.0)), ("CA", (1.0, 0, 0))])]  # CA here is not an amino acid
    with pytest.raises(InputError, match="no amino-acid residues"):
        load_structure(_text(pdb_lines(ligand, record="HETATM")))


def test_missing_residues_are_absent_and_scores_normalise_by_the_native():
    native_ca = random_walk(40, seed=7)
    keep = np.r_[0:15, 25:40]  # residues 16-25 unresolved in the model
    model = _text(pdb_lines([("ALA", int(i) + 1, "", [("CA", native_ca[i])]) for i in keep]))
    native = _text(pdb_lines(ca_residues(native_ca)))
    s = load_structure(model)
    assert s.residue_numbers.tolist() == [int(i) + 1 for i in keep]
    result = tm_score(model, native)
    assert (result.n_aligned, result.length) == (30, 40)
    assert result.tm_score == pytest.approx(30 / 40, abs=1e-6)
    per = lddt(model, native)
    assert np.all(per.per_residue[15:25] == 0.0)  # native residues without a model counterpart


def test_residue_without_ca_is_kept_with_nan():
    walk = random_walk(4, seed=8)
    residues = [("ALA", i + 1, "", [("N", xyz - 1.0), ("CA", xyz), ("C", xyz + 1.0)]) for i, xyz in enumerate(walk)]
    residues[2] = ("ALA", 3, "", [("N", walk[2] - 1.0), ("C", walk[2] + 1.0)])
    s = load_structure(_text(pdb_lines(residues)))
    assert len(s) == 4 and np.isnan(s.ca[2]).all() and np.isfinite(s.n[2]).all()
    assert tm_score(s, s).n_aligned == 3


def test_insertion_codes_are_kept_and_paired():
    walk = random_walk(6, seed=9)
    numbers = [(50, ""), (51, ""), (52, ""), (52, "A"), (52, "B"), (53, "")]
    native = _text(pdb_lines([("GLY", n, ic, [("CA", xyz)]) for (n, ic), xyz in zip(numbers, walk)]))
    s = load_structure(native)
    assert s.residue_labels() == ["50", "51", "52", "52A", "52B", "53"]
    model = _text(pdb_lines([("GLY", n, ic, [("CA", xyz)]) for (n, ic), xyz in zip(numbers[:4], walk[:4])]))
    assert tm_score(model, native).n_aligned == 4
    with pytest.raises(InputError, match="insertion codes"):
        contact_precision(np.zeros((10, 10)), native)


def test_unreadable_and_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_structure(tmp_path / "absent.pdb")
    garbage = tmp_path / "garbage.pdb"
    garbage.write_text("this is not a structure\nat all\n")
    with pytest.raises(InputError):
        load_structure(garbage)
    broken = tmp_path / "broken.cif"
    broken.write_text("data_x\nloop_\n_atom_site.id\n1 2 3\n")
    with pytest.raises(InputError):
        load_structure(broken)
    corrupt = tmp_path / "corrupt.pdb.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InputError, match="gzip"):
        load_structure(corrupt)
