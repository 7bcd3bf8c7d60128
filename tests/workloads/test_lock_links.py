"""A lock file or part folder planted as a link in a fresh ``--out`` is refused in one line (exit 2); the file or
folder it names, outside ``--out``, is neither truncated, created nor written into."""

import os

import pytest

from ptq_protein.cli.main import main

FASTA = ">a\nMKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ\n>b\nMENDELKKLLAAGHRW\n"


@pytest.fixture()
def fasta(tmp_path):
    path = tmp_path / "x.fasta"
    path.write_text(FASTA)
    return path


def run(command, fasta, out, *extra):
    if command == "embed":
        return main(["embed", "tiny-esm2", str(fasta), "--out", str(out), "--quiet", *extra])
    return main(["fold", "tiny-esmfold", "--fasta", str(fasta), "--out", str(out), "--quiet", *extra])


@pytest.mark.parametrize("command, name", [("embed", ".embed-1-of-1.lock"), ("embed", ".embed_run.json.lock"),
                                           ("embed", ".embed.lock"), ("fold", ".ptq-protein.lock"),
                                           ("fold", ".fold_index.json.lock")])
@pytest.mark.parametrize("how", ["link", "dangling", "hard link"])
def test_a_lock_name_planted_as_a_link_is_refused(tmp_path, fasta, capsys, command, name, how):
    outside = tmp_path / "precious.txt"
    if how != "dangling":
        outside.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (os.link if how == "hard link" else os.symlink)(outside, out / name)
    assert run(command, fasta, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and name in err and "remove it" in err
    assert (outside.read_text() == "precious") if how != "dangling" else not outside.exists()


def test_a_parts_folder_planted_as_a_link_is_refused_before_any_part_is_written(tmp_path, fasta, capsys):
    pytest.importorskip("h5py")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    assert run("embed", fasta, out, "--format", "h5") == 0
    (out / "embeddings.1-of-1.h5").unlink()  # a rerun has work to do
    (out / "parts-1-of-1").symlink_to(elsewhere)
    assert run("embed", fasta, out, "--format", "h5") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "parts-1-of-1 is a link" in err
    assert not list(elsewhere.iterdir())
    (out / "parts-1-of-1").unlink()
    assert run("embed", fasta, out, "--format", "h5") == 0  # once removed, the run goes on
