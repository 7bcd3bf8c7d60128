"""``fold --shard K/N`` and torchrun ranks: the shares fold into one folder, together equal to one whole run."""

import json

import pytest

from ptq_protein.cli.main import main

SEQS = {"a": "MKTAYIAKQRQISF", "b": "MENDELKKLL", "c": "ACDEFGHIKLMNPQRS"}


@pytest.fixture()
def fasta(tmp_path):
    path = tmp_path / "seqs.fasta"
    path.write_text("".join(f">{k}\n{v}\n" for k, v in SEQS.items()))
    return path


def fold(*args) -> int:
    return main(["fold", "tiny-esmfold", *map(str, args), "--quiet"])


def test_shards_fill_one_folder_as_one_run_does(tmp_path, fasta, monkeypatch):
    assert fold("--fasta", fasta, "--out", tmp_path / "whole") == 0
    assert fold("--fasta", fasta, "--out", tmp_path / "shards", "--shard", "1/2") == 0
    first = set(json.loads((tmp_path / "shards" / "fold_index.json").read_text()))
    assert 0 < len(first) < 3
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")  # torchrun's second rank: the other share, no flag
    assert fold("--fasta", fasta, "--out", tmp_path / "shards") == 0
    index = json.loads((tmp_path / "shards" / "fold_index.json").read_text())
    assert set(index) == set(SEQS)  # both shards' entries kept
    for name in index.values():
        assert (tmp_path / "shards" / name).read_text() == (tmp_path / "whole" / name).read_text()


def test_shard_option_checked_before_the_model_loads(tmp_path, fasta, capsys):
    assert fold("--fasta", fasta, "--out", tmp_path / "o", "--shard", "0/2") == 2
    assert "--shard 0/2" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
