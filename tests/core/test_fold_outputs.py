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
