"""Every artifact carries a README.md model card: Hub front matter, source, recipe in words, calibration,
the fidelity table quantize printed, how to load it, versions; and the card is outside the seal."""

import hashlib
import json

import pytest

import ptq_protein as pp
from ptq_protein.cli.main import main


def _front_matter(card: str) -> dict:
    import yaml

    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_card_of_a_python_save(esm2, seqs, tmp_path):
    q = pp.quantize(esm2, "w8a8-dynamic")
    source = tmp_path / "esm2_t6_8M_UR50D.pt"
    source.write_bytes(b"weights")
    sha = hashlib.sha256(b"weights").hexdigest()
    pp.save(q, tmp_path / "a", model_info={"name": "esm2_t6_8M_UR50D", "source": str(source), "source_sha256": sha})
    card = (tmp_path / "a" / "README.md").read_text()
    meta = _front_matter(card)
    assert meta["library_name"] == "ptq-protein" and "ptq-protein" in meta["tags"] and "quantized" in meta["tags"]
    assert meta["base_model"] == "facebook/esm2_t6_8M_UR50D"
    for words in (sha, "weights 8, activations 8", "per_token dynamic", "kept in floating point",
                  "None (weight-only or dynamic recipe)", "Not measured", "pp.load(", "ptq-protein export",
                  f"ptq_protein: {pp.__version__}"):
        assert words in card, words
    assert "from_pretrained" not in card  # fair-esm: no transformers route


@pytest.mark.parametrize("recipe, words", [
    ("w8a8-dynamic", ["backend recorded: fake", "integer GEMMs (backend 'int8')", "CUDA: the recorded backend",
                      "backend='fake'"]),
    ("w8a8-fp8", ["backend recorded: fake", "anywhere: the recorded backend 'fake'"]),
])
def test_card_says_which_backend_runs_where(esm2, tmp_path, recipe, words):
    """recipe.json records the backend quantized with (the simulation); the card says what a load runs, where."""
    pp.save(pp.quantize(esm2, recipe, calibration=["MKTAYIAKQRQISFVK"]), tmp_path / "a")
    card = " ".join((tmp_path / "a" / "README.md").read_text().split())
    for said in words:
        assert said in card, said
    assert "- backend: fake" not in card


def test_cli_card_holds_the_printed_fidelity_table(tmp_path, capsys):
    out = tmp_path / "art"
    assert main(["quantize", "tiny-esm2", "--preset", "w8a8-uniform", "--calib", "casp14:3", "--check", "2",
                 "--compare", "none", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    card = (out / "README.md").read_text()
    table = [line for line in printed.splitlines() if line.startswith("  w8a8-uniform")]
    assert table and table[0] in card and "fidelity vs the FP model" in card
    pp.load(out)  # the rewritten card does not touch the seal


def test_card_is_outside_the_seal_and_hf_card_says_from_pretrained(hf_esm2, seqs, tmp_path):
    q = pp.quantize(hf_esm2, "w8a8-uniform", calibration=seqs)
    pp.save(q, tmp_path / "h", fidelity_markdown="| recipe | rel. error |\n|---|---|\n| w8a8-uniform | 0.01 |")
    card = (tmp_path / "h" / "README.md").read_text()
    assert _front_matter(card)["library_name"] == "transformers"
    assert "EsmForMaskedLM.from_pretrained(" in card and "| w8a8-uniform | 0.01 |" in card
    (tmp_path / "h" / "README.md").write_text(card + "\nEdited on the Hub.\n")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    config["note"] = "edited"
    (tmp_path / "h" / "config.json").write_text(json.dumps(config))
    pp.load(tmp_path / "h")  # neither changes an output, so neither is refused


@pytest.mark.parametrize("name, base", [("facebook/esm2_t33_650M_UR50D", "facebook/esm2_t33_650M_UR50D"),
                                        ("esm2_t12_35M_UR50D", "facebook/esm2_t12_35M_UR50D"),
                                        ("esmfold", "facebook/esmfold_v1"),
                                        ("my-model", None),
                                        ("esm2_tiny", None),  # a file named esm2_tiny.pt: nobody's release
                                        ("esm2_t6_custom", None),
                                        ("runs/local-folder", None)])  # a local path, not a Hub id
def test_base_model_only_for_hub_names(esm2, tmp_path, monkeypatch, name, base):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "local-folder").mkdir(parents=True)
    pp.save(pp.quantize(esm2, "w8-only"), tmp_path / "a", model_info={"name": name})
    assert _front_matter((tmp_path / "a" / "README.md").read_text()).get("base_model") == base


def test_card_says_how_to_install_from_source(esm2, tmp_path):
    pp.save(pp.quantize(esm2, "w8-only"), tmp_path / "a", model_info={"name": "esm2_tiny"})
    card = (tmp_path / "a" / "README.md").read_text()
    assert "pip install ptq-protein" not in card and "pip install 'ptq-protein" not in card
    assert "git clone https://github.com/ptq-protein/ptq-protein && pip install -e ./ptq-protein" in card
