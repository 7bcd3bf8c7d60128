"""Crafted ``.pt`` / ``.pth`` files: a pickle BUILD that would set attributes of an allowed class is refused
(torch's weights-only loader refuses it too), and a plain pickle is named as one, with no torch warning first."""

import io
import pickle
import warnings
import zipfile

import pytest
import torch

from ptq_protein.cli.main import main
from ptq_protein.models.checkpoints import load_torch_checkpoint
from ptq_protein.support.errors import InputError

# GLOBAL torch.storage.UntypedStorage; (None, {"x": 1}); BUILD -> setattr(UntypedStorage, "x", 1); then {"model": 1}
BUILD_ON_A_CLASS = (b"\x80\x02ctorch.storage\nUntypedStorage\nN}X\x01\x00\x00\x00xK\x01s\x86b"
                    b"0}X\x05\x00\x00\x00modelK\x01s.")


def _torch_zip_with(path, payload: bytes):
    buffer = io.BytesIO()
    torch.save({"model": 1}, buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for info in source.infolist():
            out.writestr(info.filename, payload if info.filename.endswith("/data.pkl") else source.read(info))
    return path


@pytest.fixture()
def fasta(tmp_path):
    path = tmp_path / "x.fasta"
    path.write_text(">a\nMKTAYIAK\n")
    return path


def test_a_build_on_an_allowed_class_is_refused_and_sets_nothing(tmp_path, fasta, capsys):
    path = _torch_zip_with(tmp_path / "esmc_small.pth", BUILD_ON_A_CLASS)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)  # torch's own loader refuses the file
    with pytest.raises(InputError, match="sets attributes of torch.storage.UntypedStorage"):
        load_torch_checkpoint(path)
    assert main(["embed", str(path), str(fasta), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "a crafted file" in err
    assert not hasattr(torch.storage.UntypedStorage, "x")


def test_a_plain_pickle_is_named_without_torchs_protocol_warning(tmp_path, fasta, capsys):
    path = tmp_path / "esmc_small.pth"
    path.write_bytes(pickle.dumps({"model": 1}, protocol=4))
    assert main(["embed", str(path), str(fasta), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a plain pickle, not a PyTorch file" in err
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(InputError, match="plain pickle"):
            load_torch_checkpoint(path)
    assert not [w for w in seen if "pickle protocol" in str(w.message)]
