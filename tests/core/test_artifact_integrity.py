"""The seal binds the tensors; only regular files inside the folder are read; --force keeps what it did not write.

Each test edits a real ``w8a8-pwlq`` artifact the way a careless tool or a person
would, and expects ``pp.load`` to refuse it in one line naming the file.
"""

import hashlib
import json
import os
import shutil
import struct
import threading

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import ptq_protein as pp
from ptq_protein.cli.main import main
from ptq_protein.support.errors import ArtifactError

SEQS = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDELKKLLAAGHRW", "GSHMLEDPVAGVSKEELLKLAEEAR"]


@pytest.fixture(scope="module")
def artifact(esm2, tmp_path_factory):
    path = tmp_path_factory.mktemp("integrity") / "art"
    pp.save(pp.quantize(esm2, "w8a8-pwlq", calibration=SEQS), path)
    return path


def _read(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _edited(tensor: torch.Tensor, how: str) -> torch.Tensor:
    """``tensor`` with its first element changed: by one unit in the last place (or one code), or times 3."""
    out = tensor.clone().reshape(-1)
    if out.dtype.is_floating_point:
        x = out[:1].float()
        new = torch.nextafter(x, torch.full_like(x, float("inf"))) if how == "ulp" else x * 3 + (x == 0)
        out[0] = new.to(out.dtype)
        if out[0] == tensor.reshape(-1)[0]:  # the ulp of float32 vanished in a narrower dtype: next code instead
            out.view(torch.uint8 if out.element_size() == 1 else torch.int16)[0] += 1
    elif out.dtype == torch.bool:
        out[0] = ~out[0]
    else:
        out[0] = out[0] + 1 if how == "ulp" or out[0] == 0 else out[0] * 3
        if out[0] == tensor.reshape(-1)[0]:  # wrapped around
            out[0] = out[0] - 1
    return out.reshape(tensor.shape)


def _write(work, tensors, metadata, match_files):
    save_file(tensors, str(work / "model.safetensors"), metadata=metadata)
    if match_files:  # rewrite the checksum that sits outside the seal, as a tool "fixing" the file would
        recipe = json.loads((work / "recipe.json").read_text())
        recipe["files"]["model.safetensors"] = {"sha256": _sha(work / "model.safetensors"),
                                                "bytes": (work / "model.safetensors").stat().st_size}
        (work / "recipe.json").write_text(json.dumps(recipe, indent=2, sort_keys=True))


def test_every_tensor_edit_is_refused(artifact, tmp_path):
    """Fuzz: every tensor changed once (one ulp, or x3), with and without a matching ``files`` entry."""
    tensors, metadata = _read(artifact)
    work = tmp_path / "art"
    refused = 0
    for name in sorted(tensors):
        for how in ("ulp", "x3"):
            edited = _edited(tensors[name], how)
            assert not torch.equal(edited, tensors[name]), (name, how)
            for match_files in (False, True):
                shutil.rmtree(work, ignore_errors=True)
                shutil.copytree(artifact, work)
                _write(work, {**tensors, name: edited}, metadata, match_files)
                with pytest.raises(ArtifactError) as err:
                    pp.load(work)
                text = str(err.value)
                assert "model.safetensors" in text and "\n" not in text, (name, how, match_files, text)
                refused += 1
    assert refused == 4 * len(tensors) and len(tensors) > 20


@pytest.mark.parametrize("mapped", [False, True])
def test_the_unedited_rewrite_still_loads(artifact, tmp_path, seqs, esm2, mapped):
    """The fuzz's own rewrite path, without an edit, loads: refusals above come from the edits, not the rewrite."""
    tensors, metadata = _read(artifact)
    work = tmp_path / "art"
    shutil.copytree(artifact, work)
    _write(work, tensors, metadata, match_files=True)
    loaded = pp.load(work, mapped=mapped)
    reference = pp.load(artifact)
    tokens = torch.tensor([[0, 5, 6, 7, 8, 2]])
    assert torch.equal(loaded(tokens)["logits"], reference(tokens)["logits"])


@pytest.mark.parametrize("mapped", [False, True])
def test_scale_times_three_with_rewritten_checksum_is_refused(artifact, tmp_path, mapped):
    """The audit's case: one weight scale x3, header seal untouched, ``files`` rewritten to match (also when the
    tensors are views of a mapping of the file, as ``fold`` loads them)."""
    tensors, metadata = _read(artifact)
    name = next(k for k in sorted(tensors) if k.endswith("fc1.weight_scale"))
    work = tmp_path / "art"
    shutil.copytree(artifact, work)
    _write(work, {**tensors, name: tensors[name] * 3}, metadata, match_files=True)
    with pytest.raises(ArtifactError, match="tensors_sha256"):
        pp.load(work, mapped=mapped)


@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "other-artifact"])
def test_links_and_special_files_are_never_read(artifact, tmp_path, target):
    """A link to /dev/zero, a FIFO or a link to a real file: refused before opening, never a hang."""
    work = tmp_path / "art"
    shutil.copytree(artifact, work)
    tensors = work / "model.safetensors"
    tensors.unlink()
    if target == "fifo":
        os.mkfifo(tensors)
    else:
        os.symlink("/dev/zero" if target == "/dev/zero" else artifact / "model.safetensors", tensors)
    recipe = json.loads((work / "recipe.json").read_text())
    recipe["files"]["model.safetensors"] = {"sha256": hashlib.sha256(b"").hexdigest(), "bytes": 0}
    (work / "recipe.json").write_text(json.dumps(recipe))
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("err", _load_error(work)), daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "pp.load hung on a special file"
    assert isinstance(result["err"], ArtifactError) and "model.safetensors" in str(result["err"])
    assert "link" in str(result["err"]) or "regular file" in str(result["err"])


def _load_error(path):
    try:
        pp.load(path)
    except Exception as err:  # noqa: BLE001 (the test inspects it)
        return err
    return None


@pytest.mark.parametrize("reports", [
    {"report.json": "0" * 64, "report.md": "0" * 64, "../../etc/passwd": "0" * 64},
    {"/etc/hostname": "0" * 64},
])
def test_reports_entry_cannot_point_outside(artifact, tmp_path, reports):
    """A forged ``reports`` entry is refused before any file it names is hashed (it is sealed too)."""
    work = tmp_path / "art"
    shutil.copytree(artifact, work)
    recipe = json.loads((work / "recipe.json").read_text())
    recipe["reports"] = reports
    (work / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(ArtifactError, match="reports"):
        pp.load(work)


def test_only_known_transformers_classes_are_built():
    """A forged class name never reaches getattr(transformers, name)(config)."""
    from ptq_protein.models.architecture import build_architecture

    with pytest.raises(ArtifactError, match="does not build"):
        build_architecture({"library": "transformers", "class": "pipeline", "config": {}})


def test_recursive_recipe_is_the_corrupt_artifact_line(artifact, tmp_path):
    work = tmp_path / "art"
    shutil.copytree(artifact, work)
    (work / "recipe.json").write_text("[" * 200_000)
    with pytest.raises(ArtifactError, match="not valid JSON"):
        pp.load(work)


@pytest.mark.parametrize("foreign", ["notes.txt", "preds/x.pdb"])
def test_force_keeps_files_it_did_not_write(esm2, tmp_path, foreign):
    q = pp.quantize(esm2, "w8-only")
    art = tmp_path / "art"
    pp.save(q, art)
    (art / foreign).parent.mkdir(exist_ok=True)
    (art / foreign).write_text("mine")
    with pytest.raises(FileExistsError, match=foreign.split("/")[0]):
        pp.save(q, art, force=True)
    assert (art / foreign).read_text() == "mine"


def test_force_refuses_a_user_folder_dressed_as_an_artifact(esm2, artifact, tmp_path):
    q = pp.quantize(esm2, "w8-only")
    fake = tmp_path / "thesis"
    fake.mkdir()
    (fake / "thesis.tex").write_text("\\chapter{}")
    (fake / "recipe.json").write_text(json.dumps({"format": "ptq-protein-artifact"}))
    with pytest.raises(FileExistsError, match="thesis.tex"):
        pp.save(q, fake, force=True)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "thesis.tex").write_text("x")
    os.symlink(artifact / "recipe.json", linked / "recipe.json")
    with pytest.raises(FileExistsError):
        pp.save(q, linked, force=True)
    assert (fake / "thesis.tex").exists() and (linked / "thesis.tex").exists()


@pytest.mark.parametrize("size", [2**40, 2**64 - 1])
def test_a_header_length_past_the_file_is_one_line_naming_it(artifact, tmp_path, size, capsys):
    """``_header`` read the declared length before bounding it: MemoryError or OverflowError, no file name."""
    work = tmp_path / "art"
    shutil.copytree(artifact, work)
    file = work / "model.safetensors"
    file.write_bytes(struct.pack("<Q", size) + file.read_bytes()[8:])
    recipe = json.loads((work / "recipe.json").read_text())
    recipe["files"]["model.safetensors"] = {"sha256": _sha(file), "bytes": file.stat().st_size}
    (work / "recipe.json").write_text(json.dumps(recipe, indent=2, sort_keys=True))
    fasta = tmp_path / "x.fasta"
    fasta.write_text(">a\nMKTAYIAK\n")
    assert main(["embed", str(work), str(fasta), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{file} declares a safetensors header of {size} bytes" in err
