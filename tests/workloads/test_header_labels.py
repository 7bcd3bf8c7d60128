"""Labels as fair-esm's ``extract.py`` makes them, through ``ptq-protein embed``: the whole header line (a NEL,
a tab or two spaces inside kept), and control characters kept out of file names and log lines."""

import logging

import pytest
import torch

from ptq_protein import read_embeddings
from ptq_protein.cli.main import main

esm = pytest.importorskip("esm")


def embed(fasta, out, *extra):
    return main(["embed", "tiny-esm2", str(fasta), "--out", str(out), "--include", "per_tok", *extra])


def test_a_nel_in_a_header_is_no_line_break(tmp_path):
    fasta = tmp_path / "x.fasta"
    fasta.write_bytes(">P1 desc\u0085beta chain\nMKTAYIAK\n".encode())
    assert embed(fasta, tmp_path / "o", "--quiet") == 0
    (label, result), = read_embeddings(tmp_path / "o").items()
    assert label == "P1 desc\x85beta chain"  # not 'P1 desc' with 'BETACHAINMKTAYIAK' embedded
    assert result["representations"][2].shape[0] == 8


def test_labels_with_tabs_and_two_spaces_are_extract_pys(tmp_path):
    fasta = tmp_path / "x.fasta"
    fasta.write_text(">a\tfirst\nMKTAYIAK\n>b  two  spaces\nGSHMLE\n>c d\nMENDEL\n")
    assert embed(fasta, tmp_path / "o", "--quiet") == 0
    want = esm.FastaBatchedDataset.from_file(str(fasta)).sequence_labels
    assert sorted(read_embeddings(tmp_path / "o")) == sorted(want) == ["a\tfirst", "b  two  spaces", "c d"]
    assert (tmp_path / "o" / "c d.pt").is_file()  # a printable label is extract.py's file name, as it is


def test_esc_and_bel_reach_neither_file_names_nor_log_lines(tmp_path, capfd, monkeypatch):
    from ptq_protein.workloads import embed_memory

    fasta = tmp_path / "x.fasta"
    fasta.write_text(">evil\x1b[2J\x07\nMKTAYIAK\n")
    with monkeypatch.context() as patch:
        patch.setattr(embed_memory, "batch_bytes", lambda *a, **k: 1 << 50)  # too big: named on stderr
        assert embed(fasta, tmp_path / "big", "--max-memory", "64G", "--quiet") == 2
    err = capfd.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "evil\\x1b[2J\\x07" in err
    root = logging.getLogger()
    kept = root.handlers[:]
    root.handlers.clear()  # let main() install its own handler, as in a fresh process
    try:
        assert embed(fasta, tmp_path / "o") == 0
        logging.getLogger("ptq_protein.test").warning("id %s", "evil\x1b[2J\x07")
    finally:
        root.handlers[:] = kept
    err = capfd.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "id evil\\x1b[2J\\x07" in err
    names = [p.name for p in (tmp_path / "o").iterdir()]
    assert names and all(name.isprintable() for name in names)
    assert list(read_embeddings(tmp_path / "o")) == ["evil\x1b[2J\x07"]
    assert torch.is_tensor(next(iter(read_embeddings(tmp_path / "o").values()))["representations"][2])
