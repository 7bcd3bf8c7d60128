"""Exit codes: bad input is one line naming the file or variable (exit 2), before any work; a run in which
every row failed exits 1; damaged JSON, CSV and gzip files never surface as RecursionError, csv or zlib errors."""

from __future__ import annotations

import gzip

import pytest

from ptq_protein.cli.main import main

EVAL = ["eval", "contacts", "--model", "tiny-esm2", "--recipes", "fp", "--set", "cameo139:1", "--quiet"]


def _run(capsys, argv):
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err.strip()


def _deep_json(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("name, value", [("PTQ_PROTEIN_SKIP_MEMORY_CHECK", "maybe"), ("PTQ_PROTEIN_FUSED", "often")])
def test_a_bad_environment_variable_stops_the_command_before_any_work(tmp_path, capsys, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    code, err = _run(capsys, [*EVAL, "--out", str(tmp_path / "out")])
    assert code == 2 and name in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_a_run_in_which_every_row_failed_exits_1(tmp_path, capsys, monkeypatch):
    from ptq_protein.eval.bench import contacts_task

    def broken(*args, **kwargs):
        raise ValueError("native unreadable")

    monkeypatch.setattr(contacts_task, "_predict_and_score", broken)
    code, err = _run(capsys, [*EVAL, "--out", str(tmp_path / "out")])
    assert code == 1 and "every row run failed" in err and "\n" not in err


@pytest.mark.parametrize("damage", ["deep run.json", "huge csv cell"])
def test_a_damaged_run_folder_is_one_line_naming_the_file(tmp_path, capsys, damage):
    out = tmp_path / "out"
    assert main([*EVAL, "--out", str(out)]) == 0
    if damage == "deep run.json":
        (out / "run.json").write_text(_deep_json())
        name = "run.json"
    else:
        table = (out / "results.csv").read_text().splitlines()
        (out / "results.csv").write_text("\n".join([table[0], table[1] + "x" * 200_000, *table[2:]]) + "\n")
        name = "results.csv"
    code, err = _run(capsys, [*EVAL, "--out", str(out)])
    assert code == 2 and str(out / name) in err and "\n" not in err, err


def test_a_deep_fold_index_and_run_record_name_their_file(tmp_path):
    from ptq_protein.errors import InputError
    from ptq_protein.eval.bench.folding import _read_index
    from ptq_protein.eval.bench.results_store import check_run_info

    (tmp_path / "fold_index.json").write_text(_deep_json())
    with pytest.raises(InputError, match="fold_index.json is not readable JSON"):
        _read_index(tmp_path / "fold_index.json")
    (tmp_path / "run.json").write_text(_deep_json())
    with pytest.raises(InputError, match="run.json is not readable JSON"):
        check_run_info(tmp_path, {"command": "sensitivity"})


def test_a_corrupt_gzip_fasta_is_one_line_naming_the_file(tmp_path, capsys):
    data = bytearray(gzip.compress(b">a\nMKTAYIAKQRQISFVKSHFSRQ\n" * 50))
    data[12] ^= 0xFF
    data[13] ^= 0xFF  # a broken deflate stream: zlib.error, not gzip's own OSError
    bad = tmp_path / "seqs.fasta.gz"
    bad.write_bytes(bytes(data))
    code, err = _run(capsys, [*EVAL[:-3], "--set", str(bad), "--quiet", "--out", str(tmp_path / "out")])
    assert code == 2 and str(bad) in err and "corrupt gzip" in err and "\n" not in err, err
