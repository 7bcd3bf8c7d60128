"""A quantized model or artifact given where a float model belongs is refused, in one line, everywhere.

Quantizing it again stacks a second recipe on the first; using it as the FP reference makes every
fidelity number compare quantized with quantized (issue 40).
"""

import pytest

import ptq_protein as pp
from ptq_protein.cli.main import main
from ptq_protein.support.errors import InputError


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    folder = tmp_path_factory.mktemp("art") / "hf-w8a8u"
    assert main(["quantize", "tiny-esm2-hf", "--preset", "w8a8-uniform", "--calib", "casp14:2", "--check", "0",
                 "--out", str(folder), "--quiet"]) == 0
    return folder


@pytest.fixture(scope="module")
def fair_artifact(tmp_path_factory):
    folder = tmp_path_factory.mktemp("art") / "fair-w8"
    assert main(["quantize", "tiny-esm2", "--preset", "w8-only", "--check", "0", "--out", str(folder), "--quiet"]) == 0
    return folder


def test_eval_of_a_fair_esm_artifact_says_what_it_is(fair_artifact, tmp_path, capsys):
    """Was: '... is a folder but not a Hugging Face model folder'."""
    code = main(["eval", "contacts", "--model", str(fair_artifact), "--limit", "1", "--out", str(tmp_path / "ev")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "already quantized (w8-only)" in err and "(tiny-esm2)" in err, err
    assert "Hugging Face" not in err


@pytest.fixture(scope="module")
def quantized(artifact):
    return pp.load(artifact)


def test_api_refuses_a_quantized_model(quantized):
    with pytest.raises(InputError, match=r"already quantized \(w8a8-uniform\)"):
        pp.quantize(quantized, "w8a8-pwlq", calibration=["MKTAYIAKQR"])


def test_api_refuses_quantized_modules_without_a_record(quantized):
    import copy

    by_hand = copy.deepcopy(quantized)
    del by_hand.ptq_state
    with pytest.raises(InputError, match=r"already quantized \(quantized modules\)"):
        pp.quantize(by_hand, "w8-only")


def test_loaded_artifacts_are_refused_by_quantize_search_and_sensitivity(artifact):
    from transformers import EsmForMaskedLM

    for model in (pp.load(artifact), EsmForMaskedLM.from_pretrained(artifact)):
        for call in (lambda m: pp.quantize(m, "w8-only"),
                     lambda m: pp.quantize(m, "auto", calibration="casp14:2", budget="logits_rel<=0.5"),
                     lambda m: pp.sensitivity(m, "w8-only", ["MKTAYIAKQR"])):
            with pytest.raises(InputError, match=r"already quantized \(w8a8-uniform\).*source model"):
                call(model)


@pytest.mark.parametrize("argv", [
    ("quantize", "{art}", "--preset", "w8a8-pwlq", "--calib", "casp14:2", "--out", "{tmp}/again"),
    ("quantize", "tiny-esm2-hf", "--weights", "{art}", "--out", "{tmp}/again"),
    ("eval", "structure", "--model", "{art}", "--set", "cameo139", "--limit", "1", "--out", "{tmp}/ev"),
    ("eval", "contacts", "--model", "{art}", "--limit", "1", "--out", "{tmp}/ev"),
    ("sensitivity", "{art}", "--out", "{tmp}/sens"),
    ("inspect", "{art}"),
    ("quantize", "{art}", "--auto", "--budget", "logits_rel<=0.5", "--out", "{tmp}/auto"),
])
def test_cli_refuses_an_artifact_as_the_model(artifact, tmp_path, capsys, argv):
    code = main([a.format(art=artifact, tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "\n" not in err and "already quantized (w8a8-uniform)" in err and "(tiny-esm2-hf)" in err, err
    assert not (tmp_path / "again").exists()


def test_load_model_of_a_fair_esm_artifact_names_it(fair_artifact):
    with pytest.raises(InputError, match=r"is a ptq-protein artifact \(recipe.json\), not a float model: load it "
                                         r"with ptq_protein.load"):
        pp.load_model(str(fair_artifact))
