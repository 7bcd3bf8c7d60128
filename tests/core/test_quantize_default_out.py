"""quantize's default --out is the recipe actually used (ESMFold's --bits 8 is bf16-trunk), checked before loading."""

import json

import pytest

from ptq_protein.cli import models_arg, quantize_cmd
from ptq_protein.cli.main import main
from ptq_protein.models.loading import family_before_loading


@pytest.mark.parametrize("name, family", [("tiny-esmfold", "hf-esmfold"), ("tiny-esmfold@3", "hf-esmfold"),
                                          ("tiny-esm2", "fair-esm"), ("esmfold", "hf-esmfold"),
                                          ("facebook/esmfold_v1", "hf-esmfold")])
def test_the_family_of_a_name_is_known_before_loading(name, family):
    assert family_before_loading(name) == family


def test_the_family_of_a_folder_is_its_config_and_of_a_pt_file_unknown(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    for folding, family in ((True, "hf-esmfold"), (False, "hf-esm")):
        (folder / "config.json").write_text(json.dumps({"model_type": "esm", "is_folding_model": folding}))
        assert family_before_loading(str(folder)) == family
    (tmp_path / "m.pt").write_bytes(b"")
    assert family_before_loading(str(tmp_path / "m.pt")) is None  # what it holds is known once unpickled


def test_the_default_out_of_an_esmfold_is_checked_before_the_model_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    taken = tmp_path / "runs" / "tiny-esmfold-bf16-trunk"
    taken.mkdir(parents=True)
    (taken / "notes.txt").write_text("not an artifact")

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(quantize_cmd, "load_float_model", no_load)
    monkeypatch.setattr(models_arg, "load_float_model", no_load)
    assert main(["quantize", "tiny-esmfold", "--check", "0", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tiny-esmfold-bf16-trunk" in err
    assert not (tmp_path / "runs" / "tiny-esmfold-w8a8-pwlq").exists()


def test_the_default_out_is_named_for_the_recipe_used(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["quantize", "tiny-esmfold", "--calib", "casp14:2", "--check", "0", "--num-recycles", "0",
                 "--quiet"]) == 0
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["tiny-esmfold-bf16-trunk"]
