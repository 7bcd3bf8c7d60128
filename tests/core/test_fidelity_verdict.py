"""A quantize whose own check is far outside what its recipe gives is not presented as a success.

The bound (``workflows/fidelity_bound``) is checked against its closed form; the path end to end with a
SmoothQuant fold broken on purpose (the weights' scaling undone, as the released mapped pages undid it before,
and their sign flipped so that the break shows on any model): exit 3, one line, the verdict sealed in the
artifact, and a warning where the artifact is loaded.
"""

import json

import pytest

import ptq_protein as pp
from ptq_protein.cli.main import main
from ptq_protein.recipes.presets import get_preset
from ptq_protein.workflows.fidelity_bound import recipe_bound, verdict

SEQS = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDELKKLLAAGHRW", "GSHMLEDPVAGVSKEELLKLAEEAR"]


@pytest.mark.parametrize("name, bits, rel", [("w8a8-uniform", 8, 0.5), ("w6a6-pwlq", 6, 1.0), ("w4a8-pwlq", 4, 1.0),
                                             ("a8-uniform", 8, 0.5), ("w8a8-fp8", 8, 0.5), ("fp", None, None)])
def test_bound_from_the_fewest_bits(name, bits, rel):
    bound = recipe_bound(get_preset(name))
    if bits is None:
        assert bound is None  # nothing quantized, nothing to bound
        return
    assert (bound.bits, bound.max_relative_error) == (bits, min(1.0, 0.5 * 2.0 ** (8 - bits)))
    assert bound.max_relative_error == rel
    assert bound.min_tm_vs_fp == {8: 0.9, 6: 0.6, 4: 0.5}[bits]  # 1 - 0.1 * 2 ** (8 - b), at least 0.5


def test_bound_of_seven_bits_doubles_the_eight_bit_one():
    cfg = get_preset("w8a8-uniform")
    seven = cfg.replace(activations=cfg.activations.__class__(**{**cfg.activations.to_dict(), "bits": 7}))
    assert recipe_bound(seven).max_relative_error == 2 * recipe_bound(cfg).max_relative_error


def test_verdict_names_each_limit_crossed_and_nan_is_outside():
    bound = recipe_bound(get_preset("w8a8-uniform"))
    assert verdict(bound, {"relative_error": 0.02, "top1_agreement": 0.97})["within"]
    found = verdict(bound, {"relative_error": 1.04, "top1_agreement": 0.33})
    assert not found["within"] and found["outside"] == ["rel. error 1.04 > 0.5", "top-1 agreement 0.33 < 0.5"]
    assert not verdict(bound, {"relative_error": float("nan")})["within"]
    assert verdict(bound, {"relative_error": 0.1, "tm_vs_fp": 0.8})["outside"] == ["TM-score to FP 0.8 < 0.9"]
    assert verdict(bound, {"relative_error": 0.1, "tm_vs_fp": 0.95})["within"]


@pytest.fixture
def calib(tmp_path):
    path = tmp_path / "calib.fasta"
    path.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(SEQS)))
    return str(path)


@pytest.fixture
def broken_smoothquant(monkeypatch):
    from ptq_protein.transforms import smoothquant

    real = smoothquant._fold_

    def fold_that_changes_the_function(model, ln_name, lin_names, act_absmax, spec):
        s = real(model, ln_name, lin_names, act_absmax, spec)
        for name in lin_names:  # the weights' scaling undone, and worse: the model no longer computes its function
            model.get_submodule(name).weight.div_(-s)
        return s

    monkeypatch.setattr(smoothquant, "_fold_", fold_that_changes_the_function)


def test_quantize_outside_its_bound_exits_3_and_marks_the_artifact(broken_smoothquant, calib, tmp_path, capsys,
                                                                   caplog):
    out = tmp_path / "sq"
    code = main(["quantize", "tiny-esm2", "--preset", "w8a8-smoothquant", "--calib", calib, "--out", str(out),
                 "--quiet", "--compare", "w8a8-uniform"])
    captured = capsys.readouterr()
    assert code == 3
    warning = [ln for ln in captured.err.splitlines() if "far outside" in ln]
    assert len(warning) == 1 and "w8a8-smoothquant" in warning[0] and "exits with code 3" in warning[0]
    table = captured.out.splitlines()
    assert any(ln.strip().startswith("w8a8-smoothquant") and "outside its bound" in ln for ln in table)
    assert any(ln.strip().startswith("w8a8-uniform") and "outside" not in ln for ln in table)
    fidelity = json.loads((out / "recipe.json").read_text())["fidelity"]
    assert fidelity["verdict"]["within"] is False and fidelity["relative_error"] > 0.5
    caplog.clear()
    pp.load(out)
    assert any("far outside" in r.getMessage() for r in caplog.records)


def test_quantize_within_its_bound_exits_0_and_records_the_check(calib, tmp_path, capsys, caplog):
    out = tmp_path / "sq"
    assert main(["quantize", "tiny-esm2", "--preset", "w8a8-smoothquant", "--calib", calib, "--out", str(out),
                 "--quiet", "--compare", "none", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["fidelity_verdict"]["within"] is True
    assert json.loads((out / "recipe.json").read_text())["fidelity"]["verdict"]["within"] is True
    caplog.clear()
    pp.load(out)
    assert not any("far outside" in r.getMessage() for r in caplog.records)
