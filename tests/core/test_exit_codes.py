"""Exit codes: bad input is one line naming the file or variable (exit 2), before any work; a run in which
every row failed exits 1; damaged JSON, CSV and gzip files never surface as RecursionError, csv or zlib errors."""

from __future__ import annotations

import gzip

import pytest

from ptq_protein.cli.main import main

EVAL = ["eval", "contacts", "--model", "tiny-esm2", "--recipes", "fp", "--set", "cameo139:1", "--quiet"]


def _run(capsys, argv):
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as stop:  # the parser's own refusals
        code = stop.code
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
    if name == "results.csv":
        assert "results.csv line 2:" in err


def test_a_deep_fold_index_and_run_record_name_their_file(tmp_path):
    from ptq_protein.eval.bench.folding import _read_index
    from ptq_protein.eval.bench.results_store import check_run_info
    from ptq_protein.support.errors import InputError

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


@pytest.mark.parametrize("argv, needle", [
    (["fold", "tiny-esmfold", "--fasta", "{fa}", "--out", "/proc/ptq-x"], "cannot write /proc/ptq-x:"),
    (["fold", "tiny-esmfold", "--fasta", "{fa}", "--out", "{tmp}/o", "--max-memory", "0.5"], "at least one byte"),
    (["quantize", "tiny-esmfold", "--preset", "study-w8a8-pwlq", "--out", "{tmp}/q"], "not saved as an artifact"),
    (["tmscore", "/dev/zero", "{fa}"], "/dev/zero is a device or pipe, not a regular file"),
])
def test_refused_before_any_model_loads(tmp_path, capsys, monkeypatch, argv, needle):
    from ptq_protein.models import loading

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(loading, "load_model", never)
    fasta = tmp_path / "s.fa"
    fasta.write_text(">a\nMKTAYIAKQRQ\n")
    code, err = _run(capsys, [a.format(fa=fasta, tmp=tmp_path) for a in argv])
    assert code == 2 and needle in err and "\n" not in err, err


def test_export_names_the_destination_it_cannot_write(tmp_path, capsys):
    pytest.importorskip("onnx")
    import ptq_protein as pp
    from ptq_protein.models.tiny import tiny_esm2

    pp.save(pp.quantize(tiny_esm2(seed=0)[0], "w8-only"), tmp_path / "a")
    code, err = _run(capsys, ["export", str(tmp_path / "a"), "--format", "onnx", "--out", "/proc/ptq-x.onnx"])
    assert code == 2 and "cannot write /proc/ptq-x.onnx:" in err and ".tmp-" not in err, err


def test_fold_takes_sequences_over_1022_residues_with_a_note(tmp_path, capsys, monkeypatch, caplog):
    """ESMFold's LM is rotary (no position table): a long sequence is folded, with one line saying so."""
    from ptq_protein.eval.bench import folding

    seen = {}

    def fake_fold(model, records, out_dir, *args, **kwargs):
        seen.update(records)
        return {"long": folding.Folded(50.0, out_dir / "long.pdb", None, None)}

    monkeypatch.setattr(folding, "fold_to_pdbs", fake_fold)
    fasta = tmp_path / "long.fa"
    fasta.write_text(">long\n" + "MKTAYIAKQR" * 110 + "\n")
    code, err = _run(capsys, ["fold", "tiny-esmfold", "--fasta", str(fasta), "--out", str(tmp_path / "o"),
                              "--pair-bits", "8"])
    assert code == 0, err
    assert len(seen["long"]) == 1100
    assert "long: 1100 residues; ESMFold's language model was trained on at most 1022" in err  # said once folded


def test_a_failed_atomic_write_names_the_destination_not_its_temp_file():
    from ptq_protein.support.io_utils import atomic_write_bytes

    with pytest.raises(OSError) as err:
        atomic_write_bytes("/proc/ptq-x.onnx", b"x")
    assert err.value.filename == "/proc/ptq-x.onnx" and ".tmp-" not in str(err.value)
