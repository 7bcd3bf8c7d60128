"""An ESM C artifact: pp.load rebuilds it; transformers has no ESM C class, so from_pretrained refuses in one line."""

import json
import subprocess
import sys

import pytest
import torch

import ptq_protein as pp
from ptq_protein.artifact.hf_files import no_class_message
from ptq_protein.models.tokens import tokenize_esmc


@pytest.fixture(scope="module")
def artifact(esmc, tmp_path_factory):
    folder = tmp_path_factory.mktemp("esmc") / "a"
    pp.save(pp.quantize(esmc, "w8a8-dynamic"), folder, model_info={"name": "esmc_300m"})
    return folder


def test_pp_load_rebuilds_the_quantized_esmc(esmc, artifact):
    qmodel = pp.load(artifact, backend="fake")  # the backend it was quantized with: bit for bit
    assert type(qmodel) is type(esmc) and qmodel.ptq_recipe["architecture"]["library"] == "ptq-protein"
    tokens = tokenize_esmc(["MKTAYIAKQRQ", "MENDEL"])[0]
    with torch.no_grad():
        assert torch.equal(qmodel(tokens)["logits"], pp.quantize(esmc, "w8a8-dynamic")(tokens)["logits"])


@pytest.mark.parametrize("cls", ["AutoModel", "AutoModelForMaskedLM", "EsmForMaskedLM"])
def test_from_pretrained_says_it_does_not_apply(artifact, cls):
    import transformers

    with pytest.raises(ValueError) as err:
        getattr(transformers, cls).from_pretrained(artifact)
    assert no_class_message("ESMC") in str(err.value) and "\n" not in str(err.value)


def test_from_pretrained_refuses_in_one_line_in_a_fresh_process(artifact):
    """What a user types in a new interpreter: ptq_protein imported, then transformers' AutoModel, whose
    from_pretrained reads config.json before any model code loads (the quantizer's registration waits for that code;
    the config entry must not)."""
    code = ("import sys, ptq_protein, transformers\n"
            "try:\n"
            f"    transformers.AutoModel.from_pretrained({str(artifact)!r})\n"
            "except ValueError as err:\n"
            "    print(err)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == no_class_message("ESMC")


def test_card_names_the_source_release_and_no_transformers_snippet(artifact):
    card = (artifact / "README.md").read_text()
    assert "library_name: ptq-protein" in card and "base_model: EvolutionaryScale/esmc-300m-2024-12" in card
    assert "from_pretrained" not in card
    assert json.loads((artifact / "config.json").read_text())["architectures"] == ["ESMC"]


def test_load_model_names_it_an_artifact(artifact):
    from ptq_protein.models.loading import load_model
    from ptq_protein.support.errors import InputError

    with pytest.raises(InputError, match="is a ptq-protein artifact") as err:
        load_model(artifact)
    assert "\n" not in str(err.value)
