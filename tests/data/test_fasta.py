"""FASTA parsing and sequence checks: every malformed input gives a one-line InputError naming the fix."""

import gzip

import pytest

from ptq_protein.data.fasta import (
    ESM2_MAX_RESIDUES,
    STANDARD_AMINO_ACIDS,
    read_fasta,
    read_fasta_records,
    validate_sequence,
    write_fasta,
)
from ptq_protein.support.errors import InputError


def _one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_parses_text_with_case_whitespace_stop_and_comments():
    text = "; a comment\n>a first protein\nmk t\n AY*\n\n>b\r\nACD\r\nEF\r\n"
    assert read_fasta(text) == [("a", "MKTAY"), ("b", "ACDEF")]
    records = read_fasta_records(text)
    assert records[0].description == "first protein" and records[1].description == ""


def test_reads_plain_and_gzipped_files(tmp_path):
    plain = tmp_path / "x.fasta"
    plain.write_text(">x1 d\nMKT\n>x2\nGG\n")
    packed = tmp_path / "x.fasta.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_fasta(plain) == read_fasta(packed) == read_fasta(str(packed)) == [("x1", "MKT"), ("x2", "GG")]
    assert read_fasta(plain.read_bytes()) == [("x1", "MKT"), ("x2", "GG")]


@pytest.mark.parametrize("text, fragments", [
    ("", ["no FASTA records"]),
    ("MKT\n>a\nMKT\n", ["line 1", "before any '>' header"]),
    (">a\n>b\nMKT\n", ["'a'", "empty sequence"]),
    (">\nMKT\n", ["line 1", "without an id"]),
    (">a\nMKT\n>a\nGG\n", ["'a'", "more than once", "duplicates='rename'"]),
    (">a\nMK*T\n", ["'a'", "'*'", "position 3"]),
])
def test_malformed_fasta_is_one_line_error(text, fragments):
    with pytest.raises(InputError) as excinfo:
        read_fasta(text if text else b"")
    message = _one_line_error(excinfo)
    for fragment in fragments:
        assert fragment in message


def test_binary_garbage_and_bad_gzip(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00\x01\x02garbage\xff")
    with pytest.raises(InputError, match="binary data"):
        read_fasta(binary)
    latin = tmp_path / "latin.fasta"
    latin.write_bytes(b">a\nMK\xe9\n")
    with pytest.raises(InputError, match="not UTF-8"):
        read_fasta(latin)
    broken = tmp_path / "broken.fasta.gz"
    broken.write_bytes(gzip.compress(b">a\nMKT\n")[:-6])
    with pytest.raises(InputError, match="gzip"):
        read_fasta(broken)
    with pytest.raises(InputError, match="not found"):
        read_fasta(tmp_path / "absent.fasta")


def test_invalid_letter_names_id_letter_position_and_fix(tmp_path):
    path = tmp_path / "p.fasta"
    path.write_text(">ok\nMKT\n>bad_one\nMKTJAY\n")
    with pytest.raises(InputError) as excinfo:
        read_fasta(path)
    message = _one_line_error(excinfo)
    for fragment in (str(path), "'bad_one'", "'J'", "position 4", "replace it"):
        assert fragment in message


def test_alphabet_is_configurable():
    assert read_fasta(">a\nMXB\n") == [("a", "MXB")]  # ESM vocabulary accepts X/B/U/Z/O
    with pytest.raises(InputError, match="'X' at position 2"):
        read_fasta(">a\nMXB\n", alphabet=STANDARD_AMINO_ACIDS)


def test_over_long_sequence_names_length_limit_and_fix():
    sequence = "A" * (ESM2_MAX_RESIDUES + 1)
    assert validate_sequence(sequence) == sequence  # no limit unless asked
    with pytest.raises(InputError) as excinfo:
        read_fasta(f">long\n{sequence}\n", max_length=ESM2_MAX_RESIDUES)
    message = _one_line_error(excinfo)
    for fragment in ("'long'", "1023 residues", "limit of 1022", "at most 1022", "split it"):
        assert fragment in message


def test_validate_sequence_cleans_and_rejects():
    assert validate_sequence(" mk t*\n") == "MKT"
    with pytest.raises(InputError, match="empty"):
        validate_sequence("  *")
    with pytest.raises(InputError, match="expected a string"):
        validate_sequence(b"MKT")


def test_duplicates_rename_policy():
    text = ">a\nMK\n>a\nGG\n>b\nCC\n>a\nTT\n"
    assert read_fasta(text, duplicates="rename") == [("a", "MK"), ("a#2", "GG"), ("b", "CC"), ("a#3", "TT")]
    with pytest.raises(InputError, match="clashes"):
        read_fasta(">a\nMK\n>a#2\nGG\n>a\nTT\n", duplicates="rename")
    with pytest.raises(ValueError, match="duplicates="):
        read_fasta(text, duplicates="keep")


def test_write_fasta_round_trips_atomically(tmp_path):
    records = [("a", "MKT" * 30, "first one"), ("b", "gg")]
    path = write_fasta(tmp_path / "out" / "w.fasta", records, line_width=20)
    lines = path.read_text().splitlines()
    assert lines[0] == ">a first one" and max(len(line) for line in lines[1:]) == 20
    assert read_fasta(path) == [("a", "MKT" * 30), ("b", "GG")]
    assert [p.name for p in path.parent.iterdir()] == ["w.fasta"]  # no temp files left
    with pytest.raises(InputError, match="without whitespace"):
        write_fasta(tmp_path / "bad.fasta", [("two words", "MKT")])


def test_changes_say_what_reading_changed_per_sequence():
    from ptq_protein.data.fasta import read_fasta

    changes = {}
    records = read_fasta(">a\nmkT*\n>b\nACD\n>a\nac\n", duplicates="rename", changes=changes)
    assert records == [("a", "MKT"), ("b", "ACD"), ("a#2", "AC")]
    assert changes == {"a": "2 lower-case letters read as upper case; the terminal '*' (stop) dropped",
                       "a#2": "2 lower-case letters read as upper case"}


@pytest.mark.parametrize("brk", ["\x85", "\u2028", "\u2029", "\x0c", "\x1c", "\x1e"])
def test_a_header_keeps_every_character_but_a_line_end(brk):
    """``str.splitlines`` broke here: the header's tail became residues (BETACHAINMKTAYIAK)."""
    (record,) = read_fasta_records(f">P1 desc{brk}beta chain\nMKTAYIAK\n")
    assert record.sequence == "MKTAYIAK" and record.header == f"P1 desc{brk}beta chain"


def test_lines_end_at_universal_newlines_only_as_fair_esm_reads_them(tmp_path):
    esm = pytest.importorskip("esm")
    path = tmp_path / "x.fasta"
    path.write_bytes(">a\tx  y\r\nMK\rTA\n>b c\x85d\nGG\n".encode())
    ref = esm.FastaBatchedDataset.from_file(str(path))
    records = read_fasta_records(path)
    assert [r.header for r in records] == ref.sequence_labels == ["a\tx  y", "b c\x85d"]
    assert [r.sequence for r in records] == ref.sequence_strs == ["MKTA", "GG"]


@pytest.mark.parametrize("line", ["MK\x85TA", "MK\u2028TA", "MK\xa0TA", "MKßA"])
def test_a_sequence_line_with_a_non_ascii_character_is_refused(line):
    with pytest.raises(InputError, match="invalid letter"):
        read_fasta(f">a\n{line}\n")
