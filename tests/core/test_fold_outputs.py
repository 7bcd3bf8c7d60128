"""``fold``: ids that clean to the same name get different files; existing PDBs are never silently replaced."""

import json

import pytest

from ptq_protein.eval.bench.folding import INDEX_NAME, fold_to_pdbs


def test_colliding_ids_write_different_files_and_are_indexed(esmfold, tmp_path):
    records = [("a/b", "MKTAYIAK"), ("a_b", "GSHMLEDP")]
    written = fold_to_pdbs(esmfold, records, tmp_path)
    paths = {k: v[1] for k, v in written.items()}
    assert paths["a/b"] != paths["a_b"] and all(p.exists() for p in paths.values())
    assert paths["a_b"].name == "a_b.pdb"
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert {k: tmp_path / v for k, v in index.items()} == paths
    # each file holds its own sequence's prediction (the first residues differ)
    first = {k: next(x for x in p.read_text().splitlines() if x.startswith("ATOM"))[17:20] for k, p in paths.items()}
    assert first == {"a/b": "MET", "a_b": "GLY"}


def test_existing_pdbs_are_refused_and_force_replaces_only_indexed_ones(esmfold, tmp_path):
    (tmp_path / "mine.pdb").write_text("user file")
    with pytest.raises(FileExistsError, match="mine.pdb"):
        fold_to_pdbs(esmfold, [("mine", "MKTAYIAK")], tmp_path)
    with pytest.raises(FileExistsError, match="mine.pdb"):
        fold_to_pdbs(esmfold, [("mine", "MKTAYIAK")], tmp_path, force=True)
    assert (tmp_path / "mine.pdb").read_text() == "user file"
    fold_to_pdbs(esmfold, [("x", "MKTAYIAK")], tmp_path)
    with pytest.raises(FileExistsError, match="--force"):
        fold_to_pdbs(esmfold, [("x", "MKTAYIAK")], tmp_path)
    fold_to_pdbs(esmfold, [("x", "MKTAYIAK")], tmp_path, force=True)  # ours: replaced


def _fold_cli(capsys, tmp_path, fasta_text, *extra):
    from ptq_protein.cli.main import main

    fasta = tmp_path / "in.fasta"
    fasta.write_text(fasta_text)
    code = main(["fold", "tiny-esmfold", "--fasta", str(fasta), "--out", str(tmp_path / "out"), "--json",
                 "--quiet", *extra])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def test_fold_json_has_ptm_and_pae_as_esmfold_infers_them(esmfold, capsys, tmp_path):
    import torch

    seq = "MKTAYIAKQRQISFVK"
    code, summary, _ = _fold_cli(capsys, tmp_path, f">one\n{seq}\n")
    assert code == 0 and summary["pae_absent"] is None
    with torch.no_grad():
        want = esmfold.infer(seq)  # transformers' own single-chain path, the model's recycles
    assert summary["ptm"]["one"] == pytest.approx(float(want["ptm"]), rel=1e-4, abs=1e-6)
    pae = json.loads((tmp_path / "out" / "one.pae.json").read_text())[0]
    assert summary["pae"]["one"] == str(tmp_path / "out" / "one.pae.json")
    got = torch.tensor(pae["predicted_aligned_error"])
    assert got.shape == (len(seq), len(seq))
    torch.testing.assert_close(got, want["predicted_aligned_error"][0].float(), atol=6e-3, rtol=0)  # 2 decimals
    assert pae["max_predicted_aligned_error"] == pytest.approx(float(want["max_predicted_aligned_error"]), abs=6e-3)


def test_int8_pairs_give_ptm_and_say_why_pae_is_absent(capsys, tmp_path):
    code, summary, err = _fold_cli(capsys, tmp_path, ">one\nMKTAYIAKQRQISFVK\n", "--pair-bits", "8")
    assert code == 0 and 0.0 <= summary["ptm"]["one"] <= 1.0 and summary["pae"] == {"one": None}
    assert "--pair-bits 8" in summary["pae_absent"] and "no PAE: --pair-bits 8" in err
    assert not (tmp_path / "out" / "one.pae.json").exists()


def test_changed_letters_are_said_one_line_per_sequence_numbering_kept(capsys, tmp_path):
    code, summary, err = _fold_cli(capsys, tmp_path, ">low\nmktaXIAK*\n>plain\nGSHMLEDPV\n>odd\nACDBZ\n")
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("ptq-protein fold: ")]
    assert len(lines) == 2 and lines[0].startswith("ptq-protein fold: low: ") and "odd: " in lines[1], err
    assert "4 lower-case letters read as upper case" in lines[0] and "'*'" in lines[0] and "1 residue X" in lines[0]
    assert "2 residues B/Z folded as unknown" in lines[1]
    assert set(summary["input_changes"]) == {"low", "odd"}
    residues = {line[22:26].strip() for line in (tmp_path / "out" / "low.pdb").read_text().splitlines()
                if line.startswith("ATOM")}
    assert residues == {"1", "2", "3", "4", "6", "7", "8"}  # MKTAXIAK: X has no atoms, IAK keep 6-8
