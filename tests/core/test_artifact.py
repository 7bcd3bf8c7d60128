"""Artifacts: bit-identical reload, integer tensors on disk, atomic writes, refusal of damaged folders."""

import json

import pytest
import torch
from safetensors.torch import load_file

import ptq_protein as pp
from ptq_protein.models.adapters import get_adapter
from ptq_protein.support.errors import ArtifactError


def _out(model, seqs):
    batch = get_adapter(model).make_batch(seqs)
    with torch.no_grad():
        return get_adapter(model).forward(model, batch)


@pytest.mark.parametrize("preset", ["w8a8-uniform", "w8a8-pwlq", "w4a8-pwlq", "w8a8-dynamic", "w4-only"])
def test_reload_is_bit_identical_fair_esm(esm2, seqs, tmp_path, preset):
    q = pp.quantize(esm2, preset, calibration=seqs)
    pp.save(q, tmp_path / "a")
    r = pp.load(tmp_path / "a", backend="fake")  # the saved (fake) model, run the same way
    assert torch.equal(_out(q, seqs[:2])["logits"], _out(r, seqs[:2])["logits"])
    tensors = load_file(str(tmp_path / "a" / "model.safetensors"))
    codes = [k for k in tensors if k.endswith(("weight_codes", "weight_packed"))]
    assert codes and all(tensors[k].dtype in (torch.int8, torch.uint8) for k in codes)
    if preset.startswith("w4"):
        assert all(k.endswith("weight_packed") for k in codes)
    recipe = json.loads((tmp_path / "a" / "recipe.json").read_text())
    assert recipe["config"]["name"] == preset and recipe["versions"]["torch"] == torch.__version__
    assert (tmp_path / "a" / "report.md").exists()


def test_reload_esmfold_and_hf(esmfold, hf_esm2, seqs, tmp_path):
    q = pp.quantize(esmfold, "w8a8-pwlq", calibration=seqs[:2], num_recycles=0)
    pp.save(q, tmp_path / "f")
    r = pp.load(tmp_path / "f", backend="fake")
    assert torch.equal(q.infer(seqs[1])["positions"], r.infer(seqs[1])["positions"])
    q = pp.quantize(hf_esm2, "w8a8-uniform", calibration=seqs)
    pp.save(q, tmp_path / "h")
    r = pp.load(tmp_path / "h", backend="fake")
    batch = get_adapter(q).make_batch(seqs[:2])
    with torch.no_grad():
        assert torch.equal(q(**batch.inputs).logits, r(**batch.inputs).logits)


def test_existing_out_is_kept_without_force(esm2, seqs, tmp_path):
    q = pp.quantize(esm2, "w8-only")
    out = tmp_path / "a"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="--force"):
        pp.save(q, out)
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(FileExistsError, match="not a ptq-protein artifact"):  # --force replaces only artifacts
        pp.save(q, out, force=True)
    assert (out / "keep.txt").read_text() == "mine"
    art = tmp_path / "art"
    pp.save(q, art)
    pp.save(q, art, force=True)  # an artifact of its own files only is replaced
    (art / "extra.txt").write_text("x")
    with pytest.raises(FileExistsError, match="extra.txt"):  # --force never deletes what it did not write
        pp.save(q, art, force=True)
    assert (art / "extra.txt").read_text() == "x" and (art / "recipe.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temp folders left behind"


def test_damaged_artifacts_are_refused(esm2, tmp_path):
    q = pp.quantize(esm2, "w8-only")
    pp.save(q, tmp_path / "a")
    tensors = tmp_path / "a" / "model.safetensors"
    data = tensors.read_bytes()
    tensors.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="truncated"):
        pp.load(tmp_path / "a")
    tensors.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ArtifactError, match="sha256"):
        pp.load(tmp_path / "a")
    (tmp_path / "a" / "recipe.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        pp.load(tmp_path / "a")
    with pytest.raises(ArtifactError, match="not an artifact folder"):
        pp.load(tmp_path / "missing")
    with pytest.raises(ValueError, match="quantize it first"):
        pp.save(esm2, tmp_path / "b")


def test_versions_come_from_metadata_without_importing_optional_libraries():
    """The recorded versions equal the libraries' own ``__version__``, read without importing them."""
    import subprocess
    import sys

    code = ("import json, sys\nfrom ptq_protein.artifact.save_load import _versions\nv = _versions()\n"
            "print(json.dumps([v, 'transformers' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    versions, imported = json.loads(out)
    import esm
    import transformers

    assert not imported
    assert versions["transformers"] == transformers.__version__ and versions["esm"] == esm.__version__
