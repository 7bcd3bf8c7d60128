"""The w8a8-rotate recipes end to end: config, passes, refusals (API and CLI), artifacts, the int8 backend."""

import json

import pytest
import torch

import ptq_protein as pp
from ptq_protein.cli.main import main
from ptq_protein.nn.modules import QuantLinear
from ptq_protein.passes.recipe import resolve_recipe
from ptq_protein.recipes.config import Backend, QuantConfig
from ptq_protein.recipes.presets import PRESET_DOCS
from ptq_protein.support.errors import InputError

ROTATE = ("w8a8-rotate", "w8a8-rotate-gptq")


def _logits(model, seqs):
    from ptq_protein.models.tokens import tokenize_esmc

    with torch.no_grad():
        return model(tokenize_esmc(seqs)[0])["logits"]


def _rel(got, want):
    return float((got - want).norm() / want.norm())


def test_the_presets_are_w8a8_dynamic_plus_a_block_128_rotation():
    dynamic = pp.get_preset("w8a8-dynamic")
    rotate, gptq = (pp.get_preset(n) for n in ROTATE)
    assert rotate == dynamic.replace(rotate_ffn=128, name="w8a8-rotate")
    assert gptq.rotate_ffn == 128 and gptq.gptq is not None and gptq.gptq.damp == 0.01 and gptq.gptq.act_order
    assert (gptq.gptq.block_size, gptq.gptq.group_size) == (128, -1)
    for name in ROTATE:
        doc = PRESET_DOCS[name]
        for words in ("ESM C only", "W8 per-channel symmetric", "A8 per-token dynamic symmetric", "Hadamard",
                      "128", "float32"):
            assert words in doc, (name, words)


def test_only_rotating_configs_write_the_key():
    """Every other preset's dict, hence its recipe digest, is what it was before the option existed."""
    assert [n for n, c in pp.PRESETS.items() if "rotate_ffn" in c.to_dict()] == list(ROTATE)
    data = pp.get_preset("w8a8-rotate").to_dict()
    assert data["rotate_ffn"] == 128 and QuantConfig.from_dict(json.loads(json.dumps(data))).rotate_ffn == 128


@pytest.mark.parametrize("bad", [1, 3, 96, -128, 128.0, True, "128"])
def test_a_block_that_is_no_power_of_two_is_refused(bad):
    with pytest.raises(ValueError, match="power of two"):
        pp.get_preset("w8a8-dynamic").replace(rotate_ffn=bad)


def test_study_recipes_refuse_a_rotation():
    with pytest.raises(ValueError, match="rotates nothing"):
        pp.get_preset("study-w8a8-pwlq").replace(rotate_ffn=128)


def test_the_rotation_is_the_first_pass():
    names = [[type(p).__name__ for p in resolve_recipe(pp.get_preset(n)).passes][:2] for n in ROTATE]
    assert names == [["RotateFfnProduct", "CalibrateOurs"], ["RotateFfnProduct", "SequentialGptq"]]


@pytest.mark.parametrize("name", ROTATE)
def test_esm2_is_refused_in_one_line_before_calibration(esm2, name, monkeypatch):
    from ptq_protein.passes import forwards

    monkeypatch.setattr(forwards, "calibrate", lambda *a, **k: pytest.fail("calibrated before the refusal"))
    with pytest.raises(InputError, match="applies to ESM C only.*fair-esm") as caught:
        pp.quantize(esm2, name)  # no calibration given: the refusal comes before the want of sequences
    assert "\n" not in str(caught.value)


def test_the_cli_refuses_esm2_with_one_line_and_exit_2(tmp_path, capsys):
    code = main(["quantize", "tiny-esm2", "--preset", "w8a8-rotate", "--out", str(tmp_path / "a"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "applies to ESM C only" in err
    assert not (tmp_path / "a").exists()


@pytest.fixture(scope="module")
def saved(esmc, calib_seqs, tmp_path_factory):
    """Each rotate preset on the tiny ESM C, quantized once and saved: {name: (model, folder)}."""
    out = {}
    for name in ROTATE:
        q = pp.quantize(esmc, name, calibration=list(calib_seqs))
        out[name] = (q, pp.save(q, tmp_path_factory.mktemp(name) / "a"))
    return out


@pytest.mark.parametrize("name", ROTATE)
def test_artifact_reload_is_bit_identical_and_rotates(saved, seqs, name):
    q, path = saved[name]
    recipe = json.loads((path / "recipe.json").read_text())
    assert recipe["architecture"]["kwargs"]["ffn_rotation"] == 128 and recipe["config"]["rotate_ffn"] == 128
    loaded = pp.load(path, backend="fake")
    assert loaded.ffn_rotation == 128 and loaded.ptq_state.config == q.ptq_state.config
    assert torch.equal(_logits(loaded, seqs), _logits(q, seqs))


def test_the_int8_backend_runs_the_rotated_model(esmc, saved, seqs):
    fake = saved["w8a8-rotate"][0]
    real = pp.quantize(esmc, "w8a8-rotate", backend="int8")
    downs = [m for n, m in real.named_modules() if n.endswith("ffn.3")]
    assert downs and all(isinstance(m, QuantLinear) and m.backend is Backend.INT8 for m in downs)
    ref = _logits(esmc, seqs)
    fake_err, int8_err = _rel(_logits(fake, seqs), ref), _rel(_logits(real, seqs), ref)
    print("logits error vs FP: fake", fake_err, "int8", int8_err)
    # the same codes but where float rounding of the GEMMs moves a per-token code across a rounding boundary
    assert abs(int8_err - fake_err) < 0.1 * fake_err
    loaded = pp.load(saved["w8a8-rotate"][1])  # the default: integer GEMMs where they are exact
    assert _rel(_logits(loaded, seqs), ref) < 1.1 * fake_err


def test_shared_calibration_runs_nothing_for_it_and_no_shared_pass_serves_it(esmc, seqs):
    from ptq_protein.workflows.shared_calibration import calibrate_recipes

    passes, notes = calibrate_recipes(esmc, ["w8a8-uniform", "w8a8-rotate"], seqs)
    assert passes["w8a8-rotate"] is None and "w8a8-rotate" not in notes  # dynamic activations: no forwards at all
    with pytest.raises(ValueError, match="changes the model"):  # statistics of the unrotated products
        pp.quantize(esmc, "w8a8-rotate", statistics=passes["w8a8-uniform"])


def test_sensitivity_refuses_it_rather_than_ranking_the_unrotated_model(esmc, seqs):
    from ptq_protein.search.sensitivity import sensitivity

    with pytest.raises(InputError, match="rotate_ffn"):
        sensitivity(esmc, "w8a8-rotate", seqs[:2], calibration=seqs)
