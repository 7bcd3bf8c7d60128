"""Weights streamed from a mapped artifact: ``pp.load(mapped=True)`` and the fold that hands block pages back.

References are independent of the code under test: safetensors' own reader for the mapped tensors, the
kernel's page map (``tests/page_map.py`` reads it with ``struct``, not through ``ptq_protein.models.mapped``)
for which pages are resident, and a model loaded into owned memory for the fold's outputs.
"""

import json
import os
import struct
import sys

import pytest
import torch
from page_map import PAGE, pages_present
from safetensors.torch import load_file, save_file

import ptq_protein as pp
from ptq_protein.artifact.tensors import map_tensors
from ptq_protein.eval.bench.folding import fold_output
from ptq_protein.models import mapped as mapped_mod
from ptq_protein.models.fold_memory import dims_of, streamed_units
from ptq_protein.models.mapped import MappedFile, mapped_file_of

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")
SEQ = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQKPLMN"


def test_mapped_tensors_equal_safetensors_own_reader(tmp_path):
    file = tmp_path / "t.safetensors"
    tensors = {"w": torch.randn(33, 17), "b": torch.randn(5).to(torch.bfloat16), "codes": torch.randint(
        -128, 127, (9, 3), dtype=torch.int8), "scalar": torch.tensor(2.5), "empty": torch.empty(0, 4),
        "flags": torch.tensor([True, False, True])}
    save_file(tensors, str(file))
    mapped, reference = map_tensors(file), load_file(str(file))
    assert set(mapped) == set(reference)
    for name, tensor in reference.items():
        assert mapped[name].dtype == tensor.dtype and mapped[name].shape == tensor.shape, name
        assert torch.equal(mapped[name], tensor), name
    shared = {mapped[n].untyped_storage().data_ptr() for n in ("w", "b", "codes")}
    assert len(shared) == 1  # views of one mapping, not copies


def test_a_tensor_unaligned_for_its_dtype_is_read_as_a_copy(tmp_path):
    """safetensors' writer aligns tensors; a file that does not (3 int8 bytes, then float32 at offset 3) still reads."""
    values = torch.tensor([1.5, -2.25, 3.0])
    header = json.dumps({"a": {"dtype": "I8", "shape": [3], "data_offsets": [0, 3]},
                         "b": {"dtype": "F32", "shape": [3], "data_offsets": [3, 15]}}).encode()
    header += b" " * (-len(header) % 8)
    file = tmp_path / "odd.safetensors"
    file.write_bytes(struct.pack("<Q", len(header)) + header + bytes([1, 2, 3]) + values.numpy().tobytes())
    got = map_tensors(file)
    assert got["a"].tolist() == [1, 2, 3] and torch.equal(got["b"], values)


@pytest.fixture
def two_touched(tmp_path):
    """(file, its two 16-page tensors mapped and both read, their MappedFile)."""
    file = tmp_path / "two.safetensors"
    save_file({"a": torch.randn(16 * PAGE // 4), "b": torch.randn(16 * PAGE // 4)}, str(file))
    tensors = map_tensors(file)
    float(tensors["a"].sum()), float(tensors["b"].sum())  # touch both
    assert all(pages_present(tensors["a"])) and all(pages_present(tensors["b"]))
    return file, tensors, MappedFile(tensors.values())


@LINUX
def test_release_hands_back_only_the_given_tensors_pages(two_touched):
    """Two tensors of one mapped file: releasing the first leaves the second's pages mapped."""
    file, tensors, handle = two_touched
    assert handle.release([tensors["a"]]) >= 15 * PAGE
    assert not any(pages_present(tensors["a"])) and all(pages_present(tensors["b"]))
    assert torch.equal(tensors["a"], load_file(str(file))["a"])  # read back from the file, unchanged


@LINUX
def test_release_all_hands_back_every_tensors_pages(two_touched):
    _, tensors, handle = two_touched
    assert handle.release_all() >= 31 * PAGE
    assert not any(pages_present(tensors["a"])) and not any(pages_present(tensors["b"]))


@pytest.fixture(scope="module")
def esmfold_artifact(tmp_path_factory):
    from ptq_protein.cli.main import main

    out = tmp_path_factory.mktemp("mapped") / "art"
    assert main(["quantize", "tiny-esmfold", "--bits", "8", "--check", "0", "--calib", "casp14:2", "--quiet",
                 "--out", str(out)]) == 0
    return out


def _largest_mapped(model):
    """The largest mapped tensor inside the trunk's first block."""
    handle = mapped_file_of(model)
    block = model.trunk.blocks[0]
    return max((t for t in block.parameters() if handle.contains(t)), key=lambda t: t.numel())


@LINUX
def test_a_mapped_artifact_folds_identically_and_hands_block_pages_back(esmfold_artifact):
    owned = pp.load(esmfold_artifact)
    mapped = pp.load(esmfold_artifact, mapped=True)
    assert mapped_file_of(owned) is None and mapped_file_of(mapped) is not None
    expected = fold_output(owned, SEQ, num_recycles=2)
    got = fold_output(mapped, SEQ, num_recycles=2)
    for key in ("positions", "plddt", "ptm"):
        assert torch.equal(got[key], expected[key]), key
    weight = _largest_mapped(mapped)
    assert weight.numel() * weight.element_size() >= 2 * PAGE and not any(pages_present(weight))
    # the memory model counts one streamed unit's mapped weights, not all of them
    assert dims_of(mapped).weight_bytes < dims_of(owned).weight_bytes
    units = streamed_units(mapped)
    assert len(units) == len(mapped.esm.encoder.layer) + len(mapped.trunk.blocks)


def test_a_weight_edited_in_place_keeps_its_edit_through_streamed_folds(esmfold_artifact):
    """A page written after loading is this process's copy: handing pages back must never restore the file's."""
    owned = pp.load(esmfold_artifact)
    mapped = pp.load(esmfold_artifact, mapped=True)
    target = _largest_mapped(mapped)
    name = next(n for n, p in mapped.named_parameters() if p is target)
    with torch.no_grad():
        target.mul_(1.5)
        owned.get_parameter(name).mul_(1.5)
    first = fold_output(mapped, SEQ, num_recycles=1)
    second = fold_output(mapped, SEQ, num_recycles=1)  # the edited block ran, was released, and runs again
    expected = fold_output(owned, SEQ, num_recycles=1)
    assert torch.equal(first["positions"], expected["positions"])
    assert torch.equal(second["positions"], expected["positions"])


def test_mapped_load_refuses_a_device_it_cannot_map_to():
    with pytest.raises(ValueError, match="mapped=True"):
        pp.load("unused", device="meta", mapped=True)


@LINUX
def test_proc_reads_are_the_forked_childs_own(tmp_path):
    """The /proc descriptor is held per process: a forked child reads its own resident size, not its parent's."""
    mapped_mod.resident_bytes()  # the parent opens its descriptor
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB touched in the child only
        with open("/proc/self/statm", "rb") as handle:
            fresh = int(handle.read().split()[1]) * PAGE
        os.write(write, json.dumps([mapped_mod.resident_bytes(), fresh, float(block[0])]).encode())
        os._exit(0)
    os.close(write)
    got, fresh, _ = json.loads(os.read(read, 4096))
    os.waitpid(pid, 0)
    assert abs(got - fresh) < 8 * 2**20

