"""Outputs as users expect them: --force replaces only what ptq-protein wrote, no race between check and
rename, umask-respecting modes, killed runs' temp folders cleaned, collision-free names, one-line errors."""

import os
import stat
import subprocess
import sys

import pytest

import ptq_protein as pp
from ptq_protein.cli.main import main
from ptq_protein.support.errors import InputError
from ptq_protein.support.io_utils import atomic_dir, check_out_path, safe_stem


@pytest.fixture(scope="module")
def qmodel(esm2):
    return pp.quantize(esm2, "w8-only")


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_force_never_replaces_a_user_folder_or_file(tmp_path, capsys):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "thesis.tex").write_text("precious")
    plain = tmp_path / "notes.txt"
    plain.write_text("precious")
    for out in (user, plain):
        assert main(["quantize", "tiny-esm2", "--preset", "w8-only", "--out", str(out), "--force", "--check", "0"]) == 2
        assert "not a ptq-protein artifact" in capsys.readouterr().err
    assert (user / "thesis.tex").read_text() == "precious" and plain.read_text() == "precious"


def test_the_final_rename_refuses_a_path_created_meanwhile(qmodel, tmp_path):
    """The old code checked existence at the start and replaced whatever was there at the end."""
    target = tmp_path / "art"
    with pytest.raises(FileExistsError, match="another process"):
        with atomic_dir(target) as tmp:
            (tmp / "a").write_text("mine")
            target.mkdir()  # another writer wins the race
            (target / "theirs").write_text("theirs")
    assert (target / "theirs").read_text() == "theirs"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_two_saves_to_one_path_do_not_both_succeed(qmodel, tmp_path):
    out = tmp_path / "art"
    pp.save(qmodel, out)
    with pytest.raises(FileExistsError):
        pp.save(qmodel, out)
    pp.load(out)


def test_files_follow_the_umask_and_stale_temps_are_removed(qmodel, tmp_path):
    stale = tmp_path / f".art.tmp-{_dead_pid()}-abc"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    old = os.umask(0o022)
    try:
        pp.save(qmodel, tmp_path / "art")
    finally:
        os.umask(old)
    assert not stale.exists(), "a killed run's temp folder is cleaned by the next save"
    assert stat.S_IMODE((tmp_path / "art").stat().st_mode) == 0o755
    for f in (tmp_path / "art").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f.name


@pytest.mark.parametrize("bad", ["", ".", "FILE/sub"])
def test_bad_out_paths_are_refused_in_words(tmp_path, monkeypatch, bad):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("x")
    with pytest.raises(InputError) as err:
        check_out_path(bad)
    assert "Errno" not in str(err.value)


def test_out_problems_are_refused_before_calibration(tmp_path, capsys, monkeypatch):
    import ptq_protein.api as api

    monkeypatch.setattr(api, "quantize", lambda *a, **k: pytest.fail("calibration started"))
    (tmp_path / "f").write_text("x")
    assert main(["quantize", "tiny-esm2", "--out", str(tmp_path / "f" / "art")]) == 2
    assert "regular file" in capsys.readouterr().err


def test_ids_get_distinct_file_names():
    ids = ["a/b", "a_b", "a:b", "a b", ".hidden", "", "..", "A" * 300, "7ACY"]
    stems = [safe_stem(i) for i in ids]
    assert len(set(stems)) == len(ids)
    assert safe_stem("7ACY") == "7ACY" and safe_stem("a/b") == safe_stem("a/b")
    assert all("/" not in s and not s.startswith(".") and len(s) < 130 for s in stems)


def test_inspect_refuses_an_artifact_folder_and_existing_reports(qmodel, tmp_path, capsys):
    pp.save(qmodel, tmp_path / "art")
    before = (tmp_path / "art" / "report.md").read_bytes()
    assert main(["inspect", "tiny-esm2", "--calib", "casp14:2", "--out", str(tmp_path / "art")]) == 2
    assert "artifact folder" in capsys.readouterr().err
    assert (tmp_path / "art" / "report.md").read_bytes() == before
    (tmp_path / "ins").mkdir()
    (tmp_path / "ins" / "report.json").write_text("[]")
    assert main(["inspect", "tiny-esm2", "--calib", "casp14:2", "--out", str(tmp_path / "ins")]) == 2
    assert "--force" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["quantize", "tiny-esm2", "--bits", "x"], "invalid int"),
    (["quantize", "tiny-esm2", "--preset", ""], "--preset"),
    (["quantize", "tiny-esm2", "--check", "-1", "--out", "X"], "--check"),
    (["inspect", "tiny-esm2", "--top", "-5"], "--top"),
    (["eval", "contacts", "--model", "tiny-esm2", "--out", "X", "--max-length", "0"], "--max-length"),
])
def test_bad_options_give_one_line(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) if argv[2:4] == ["--bits", "x"] else _nothing():
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "usage:" not in err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_seed_chooses_the_tiny_models_weights():
    import argparse

    import torch

    from ptq_protein.cli.models_arg import load_float_model

    def weights(seed):
        args = argparse.Namespace(seed=seed, device="cpu", dtype=None, weights=None)
        return torch.cat([p.flatten() for p in load_float_model(args, "tiny-esm2").model.parameters()])

    assert torch.equal(weights(None), weights(0))
    assert not torch.equal(weights(0), weights(1))


def test_fold_options_that_cannot_apply_to_an_artifact_are_refused(qmodel, tmp_path, capsys):
    pp.save(qmodel, tmp_path / "art")
    fasta = tmp_path / "x.fasta"
    fasta.write_text(">a\nMKTAYIAK\n")
    for extra in (["--weights", "w.pt"], ["--dtype", "float16"]):
        assert main(["fold", str(tmp_path / "art"), "--fasta", str(fasta), "--out", str(tmp_path / "o"), *extra]) == 2
        assert extra[0] in capsys.readouterr().err
