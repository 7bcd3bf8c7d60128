"""Reading an artifact's tensors into owned memory: the same tensors safetensors' own reader returns, held once."""

import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

import ptq_protein as pp
from ptq_protein.artifact.tensors import read_tensors
from ptq_protein.support.errors import ArtifactError


def _every_dtype() -> dict:
    g = torch.Generator().manual_seed(0)
    floats = torch.randn(5, 7, generator=g)
    return {
        "codes": torch.randint(-128, 128, (6, 9), dtype=torch.int8, generator=g),
        "packed": torch.randint(0, 256, (3, 4), dtype=torch.uint8, generator=g),
        "zero_point": torch.randint(-5, 5, (6, 1), dtype=torch.int32, generator=g),
        "index": torch.arange(4, dtype=torch.int64),
        "f32": floats, "f16": floats.half(), "bf16": floats.bfloat16(), "f64": floats.double(),
        "fp8": floats.to(torch.float8_e4m3fn), "fp8_e5m2": floats.to(torch.float8_e5m2),
        "mask": floats > 0, "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4),
    }


def test_equals_safetensors_own_reader_for_every_dtype(tmp_path):
    file = tmp_path / "t.safetensors"
    save_file(_every_dtype(), str(file), metadata={"note": "kept out of the tensors"})
    ours, theirs = read_tensors(file), load_file(str(file))
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        got = ours[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), name


def test_a_truncated_or_garbled_file_is_one_artifact_error(tmp_path):
    file = tmp_path / "t.safetensors"
    save_file({"w": torch.ones(64, 64)}, str(file))
    data = file.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-100])
    with pytest.raises(ArtifactError, match="truncated"):
        read_tensors(tmp_path / "cut.safetensors")
    (tmp_path / "short.safetensors").write_bytes(data[:5])
    with pytest.raises(ArtifactError, match="too short"):
        read_tensors(tmp_path / "short.safetensors")
    header = b'{"w":{"dtype":"F32","shape":[64,64],"data_offsets":[0,10]}}'
    (tmp_path / "range.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 10)
    with pytest.raises(ArtifactError, match="byte range"):
        read_tensors(tmp_path / "range.safetensors")
    header = b'{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}'
    (tmp_path / "dtype.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0")
    with pytest.raises(ArtifactError, match="has dtype 'Q4', which no ptq-protein artifact holds"):
        read_tensors(tmp_path / "dtype.safetensors")


def test_loaded_model_holds_the_read_tensors_not_copies_of_them(esm2, seqs, tmp_path, monkeypatch):
    """The load adopts each read tensor: one copy of the weights in memory, never a shell tensor left on meta."""
    q = pp.quantize(esm2, "w8a8-uniform", calibration=seqs)
    pp.save(q, tmp_path / "a")
    import ptq_protein.artifact.save_load as artifact

    read = {}

    def spy(file):
        read.update(read_tensors(file))
        return dict(read)

    monkeypatch.setattr(artifact, "read_tensors", spy)
    model = pp.load(tmp_path / "a")
    held = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    assert not any(t.is_meta for t in held.values())
    codes = [k for k in read if k.endswith("weight_codes")]
    assert codes and all(held[k].data_ptr() == read[k].data_ptr() for k in codes)
