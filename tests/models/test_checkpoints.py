"""Checkpoint reading runs no code from the file: Namespace configs load, other objects stay inert."""

import argparse
import pickle

import pytest
import torch

from ptq_protein.models.checkpoints import Unloaded, file_sha256, load_torch_checkpoint
from ptq_protein.support.errors import InputError

EXECUTED = []


def record(tag):
    EXECUTED.append(tag)


class Payload:
    """Pickles as a call to a function with a side effect: what a malicious checkpoint would do."""

    def __reduce__(self):
        return (record, ("ran",))


class Config:
    def __init__(self, depth):
        self.depth = depth

    def __setstate__(self, state):
        EXECUTED.append("setstate")


def test_namespace_configs_load_with_weights_only(tmp_path):
    path = tmp_path / "esm2.pt"
    torch.save({"model": {"w": torch.arange(4.0)}, "cfg": {"model": argparse.Namespace(encoder_layers=2)}}, path)
    data = load_torch_checkpoint(path)
    assert data["cfg"]["model"] == argparse.Namespace(encoder_layers=2)
    assert torch.equal(data["model"]["w"], torch.arange(4.0))
    with pytest.raises(pickle.UnpicklingError):  # torch alone refuses it: the allowlist is needed
        torch.load(path, weights_only=True)


@pytest.mark.parametrize("zipfile", [True, False])
def test_other_objects_are_inert_placeholders(tmp_path, zipfile):
    EXECUTED.clear()
    path = tmp_path / "fold.pt"
    torch.save({"model": {"w": torch.ones(2, 3, dtype=torch.float16)}, "cfg": Config(3), "evil": Payload()}, path,
               _use_new_zipfile_serialization=zipfile)
    data = load_torch_checkpoint(path)
    assert EXECUTED == []
    assert torch.equal(data["model"]["w"], torch.ones(2, 3, dtype=torch.float16))
    assert isinstance(data["cfg"], Unloaded) and data["cfg"].qualified_name.endswith("Config")
    assert isinstance(data["evil"], Unloaded)
    load_torch_checkpoint(path, allow_pickle=True)  # the user vouches for the file: it really unpickles
    assert sorted(EXECUTED) == ["ran", "setstate"]


def test_unreadable_files_are_input_errors(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"model": {"w": torch.zeros(100)}}, good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:200])
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"definitely not a checkpoint")
    for path in (truncated, garbage):
        with pytest.raises(InputError, match="could not be read as a PyTorch file") as excinfo:
            load_torch_checkpoint(path)
        assert "\n" not in str(excinfo.value) and str(path) in str(excinfo.value)
    with pytest.raises(InputError, match="does not exist"):
        load_torch_checkpoint(tmp_path / "absent.pt")


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 2_304_000])
def test_file_sha256_matches_hashlib(tmp_path, size):
    import hashlib

    path = tmp_path / "blob"
    data = (bytes(range(256)) * (size // 256 + 1))[:size]  # empty, one byte, around one read chunk, several
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
