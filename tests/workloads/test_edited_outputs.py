"""An output edited inside its seal (one float changed, the seal record kept) is embedded again on a rerun, as
``read_embeddings`` would refuse it; a foreign file the rerun cannot replace is named with what to do."""

import io
import json
import logging
import shutil
import zipfile

import pytest
import torch

from ptq_protein import read_embeddings
from ptq_protein.cli.main import main
from ptq_protein.data.fasta import write_fasta
from ptq_protein.workloads.embed_seal import SEAL_RECORD

SEQS = {"a": "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "b": "MENDELKKLLAAGHRW", "c": "ACDEFGHIKLMNPQRSTVWYACDEFGHIKL"}


@pytest.fixture()
def fasta(tmp_path):
    return write_fasta(tmp_path / "seqs.fasta", SEQS.items())


def embed(fasta, out, *extra):
    return main(["embed", "tiny-esm2", str(fasta), "--out", str(out), "--include", "mean", "--quiet", *extra])


def _edit_pt_keeping_its_seal(path):
    with zipfile.ZipFile(path) as archive:
        (seal_name,) = [n for n in archive.namelist() if n.endswith("/" + SEAL_RECORD)]
        seal = archive.read(seal_name)
    result = torch.load(path, weights_only=True)
    result["mean_representations"][2][0] += 1.0
    buffer = io.BytesIO()
    torch.save(result, buffer)
    with zipfile.ZipFile(buffer, "a") as archive:
        archive.writestr(f"{archive.namelist()[0].split('/', 1)[0]}/{SEAL_RECORD}", seal)
    path.write_bytes(buffer.getvalue())


def _edit_h5_value(path):
    import h5py

    with h5py.File(path, "r+") as handle:
        handle["a"]["mean_representations"]["2"][0] += 1.0


@pytest.mark.parametrize("fmt", ["pt", "h5"])
def test_a_file_edited_inside_its_seal_is_embedded_again(tmp_path, fasta, capsys, fmt):
    if fmt == "h5":
        pytest.importorskip("h5py")
    out = tmp_path / "o"
    assert embed(fasta, out, "--format", fmt) == 0
    want = read_embeddings(out)
    if fmt == "pt":
        _edit_pt_keeping_its_seal(out / "a.pt")
        assert json.loads(zipfile.ZipFile(out / "a.pt").read(f"archive/{SEAL_RECORD}"))["label"] == "a"
    else:
        _edit_h5_value(out / "embeddings.1-of-1.h5")
    with pytest.raises(ValueError, match="differ from their sealed digest"):
        read_embeddings(out)
    capsys.readouterr()
    assert embed(fasta, out, "--format", fmt) == 0
    said = capsys.readouterr().out
    assert ("embedded 1 sequences" if fmt == "pt" else "embedded 3 sequences") in said, said
    got = read_embeddings(out)
    assert torch.equal(got["a"]["mean_representations"][2], want["a"]["mean_representations"][2])


def test_a_foreign_shard_the_rerun_cannot_replace_is_named(tmp_path, fasta, caplog):
    pytest.importorskip("h5py")
    other = tmp_path / "other.fasta"
    other.write_text(">z\nMKTAYIAK\n")
    assert embed(other, tmp_path / "theirs", "--format", "h5") == 0
    out = tmp_path / "o"
    assert embed(fasta, out, "--format", "h5") == 0
    shutil.copy(tmp_path / "theirs" / "embeddings.1-of-1.h5", out / "embeddings.1-of-9.h5")
    with caplog.at_level(logging.WARNING, logger="ptq_protein.workloads.embed_store"):
        assert embed(fasta, out, "--format", "h5") == 0
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "embeddings.1-of-9.h5 is damaged or another run's and was not replaced" in said and "moved away" in said
