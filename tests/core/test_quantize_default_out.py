"""quantize's default recipe, --out and memory mode follow the model's family, known before loading (ESMFold's
--bits 8 is bf16-trunk), and --out is checked before loading."""

import json

import pytest
import torch
from tiny_fixtures import write_fair_esm2, write_fair_esmfold

from ptq_protein.cli import models_arg, quantize_cmd
from ptq_protein.cli.main import main
from ptq_protein.models.loading import family_before_loading
from ptq_protein.workflows import memory_budget as budget


@pytest.mark.parametrize("name, family", [("tiny-esmfold", "hf-esmfold"), ("tiny-esmfold@3", "hf-esmfold"),
                                          ("tiny-esm2", "fair-esm"), ("esmfold", "hf-esmfold"),
                                          ("facebook/esmfold_v1", "hf-esmfold")])
def test_the_family_of_a_name_is_known_before_loading(name, family):
    assert family_before_loading(name) == family


def test_the_family_of_a_folder_is_its_config(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    for folding, family in ((True, "hf-esmfold"), (False, "hf-esm")):
        (folder / "config.json").write_text(json.dumps({"model_type": "esm", "is_folding_model": folding}))
        assert family_before_loading(str(folder)) == family


def test_the_family_of_a_pt_file_is_what_it_holds_whatever_its_name(tmp_path, esmfold):
    assert family_before_loading(str(write_fair_esm2(tmp_path / "a.pt"))) == "fair-esm"
    assert family_before_loading(str(write_fair_esmfold(esmfold, tmp_path / "b.pt"))) == "hf-esmfold"
    torch.save({"model": {}}, tmp_path / "c.pt")
    assert family_before_loading(str(tmp_path / "c.pt")) == "fair-esm"  # its load refuses it in words
    (tmp_path / "d.pt").write_bytes(b"")
    assert family_before_loading(str(tmp_path / "d.pt")) is None  # not a zip: told by the load


def _between(monkeypatch, fits_gptq: bool):
    """Memory for the default mode without GPTQ's share (and with it where ``fits_gptq``), under neither else."""
    real, seen = budget.estimate_quantize_memory, {}

    def estimate(size, *, low_memory, calibration_tokens, gptq=False):
        seen["args"] = (size, calibration_tokens)
        return real(size, low_memory=low_memory, calibration_tokens=calibration_tokens, gptq=gptq)

    def available():
        size, tokens = seen["args"]
        plain, gptq = (real(size, low_memory=False, calibration_tokens=tokens, gptq=g).needed_bytes
                       for g in (False, True))
        return gptq if fits_gptq else (plain + gptq) // 2

    monkeypatch.setattr(budget, "estimate_quantize_memory", estimate)
    monkeypatch.setattr(budget, "available_memory_bytes", available)


def test_an_esmfold_pt_file_takes_its_own_default_and_its_memory_estimate(tmp_path, monkeypatch, capsys, esmfold):
    """An ESMFold .pt file not named like the published one: --bits 8 is bf16-trunk before loading too, so the
    memory check counts no GPTQ and never streams it as an ESM-2 (it used to, and failed after choosing)."""
    from ptq_protein.models.loading import load_model

    monkeypatch.chdir(tmp_path)
    path = write_fair_esmfold(esmfold, tmp_path / "my_fold.pt")
    _between(monkeypatch, fits_gptq=False)
    # the tiny trunk's widths are not the published ones a fair-esm file is read with: tell the load
    monkeypatch.setattr(quantize_cmd, "load_float_model",
                        lambda args, name, mmap=False: load_model(name, config=esmfold.config, mmap=mmap))
    assert main(["quantize", str(path), "--calib", "casp14:2", "--check", "0", "--num-recycles", "0",
                 "--quiet"]) == 0
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["my_fold.pt-bf16-trunk"]
    assert "streaming" not in capsys.readouterr().err


def test_an_esmfold_pt_file_that_does_not_fit_is_refused_not_streamed(tmp_path, monkeypatch, capsys, esmfold):
    path = write_fair_esmfold(esmfold, tmp_path / "my_fold.pt")
    monkeypatch.setattr(budget, "available_memory_bytes", lambda: 1 << 20)
    for extra in ([], ["--low-memory"]):
        code = main(["quantize", str(path), "--calib", "casp14:2", "--out", str(tmp_path / "out"), *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "my_fold.pt holds an ESMFold" in err[0], err
        assert not (tmp_path / "out").exists()


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


def test_a_legacy_pt_file_still_streams(tmp_path, capsys):
    """A file in torch's pre-zip format cannot be mapped to peek at: its family is told by its load, and
    --low-memory streams it as before."""
    path = write_fair_esm2(tmp_path / "zip.pt")
    legacy = tmp_path / "esm2_t6_8M_UR50D.pt"
    torch.save(torch.load(path, weights_only=False), legacy, _use_new_zipfile_serialization=False)
    assert family_before_loading(str(legacy)) is None
    assert main(["quantize", str(legacy), "--low-memory", "--calib", "casp14:2", "--check", "0", "--quiet",
                 "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "recipe.json").read_text())["config"]["name"] == "w8a8-pwlq"
