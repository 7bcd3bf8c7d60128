"""Letters where ptq-protein reads a sequence differently from EvolutionaryScale's ESM C tokenizer, on purpose.

The official tokenizer maps a lower-case letter and a trailing ``*`` to ``<unk>``; ptq-protein reads the residue
(upper case) and drops the stop, and says so in one stderr line per changed sequence, as ``fold`` does. ``-`` and
``.`` (alignment gaps) and ``_`` (the official ``<mask>``) are refused in one line saying what they are.
"""

import pytest
import torch

from ptq_protein import read_embeddings
from ptq_protein.cli.main import main


def _cli(capsys, *args):
    try:
        code = main([*map(str, args), "--quiet"])
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err


def test_embed_says_what_reading_changed_one_line_per_sequence(tmp_path, capsys):
    fasta = tmp_path / "s.fasta"
    fasta.write_text(">low some protein\nmktayIAKQR\n>stop\nMKTAYIAKQR*\n>plain\nMKTAYIAKQR\n")
    code, err = _cli(capsys, "embed", "tiny-esmc", fasta, "--out", tmp_path / "e", "--include", "mean")
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("ptq-protein embed: ")]
    assert len(lines) == 2, err
    assert "low some protein: 5 lower-case letters read as upper case" in lines[0]
    assert "stop: the terminal '*' (stop) dropped" in lines[1]
    got = read_embeddings(tmp_path / "e")
    torch.testing.assert_close(got["low some protein"]["mean_representations"][3],
                               got["plain"]["mean_representations"][3])  # the residues, as upper case


@pytest.mark.parametrize("letter, words", [("-", "alignment gap"), (".", "alignment gap"), ("_", "<mask>"),
                                           ("|", "chain break")])
def test_letters_the_official_tokenizer_encodes_are_refused_saying_what_they_are(tmp_path, capsys, letter, words):
    fasta = tmp_path / "s.fasta"
    fasta.write_text(f">a\nMKT{letter}AYIAK\n")
    code, err = _cli(capsys, "embed", "tiny-esmc", fasta, "--out", tmp_path / "e")
    assert code == 2 and words in err and "position 4" in err and len(err.strip().splitlines()) == 1, err


def test_score_says_what_reading_changed_in_the_wild_type(tmp_path, capsys):
    code, err = _cli(capsys, "score", "tiny-esmc", "--sequence", "mktAYI", "--out", tmp_path / "s.csv")
    assert code == 0, err
    assert "ptq-protein score: --sequence: 3 lower-case letters read as upper case" in err
