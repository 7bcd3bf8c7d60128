"""transformers opens an artifact quantized from a fair-esm ESM-2 (``ptq_protein/artifact_fair_hf``).

Reference: ``pp.load`` of the same folder (the fair-esm model). With eager attention, one sequence at a time, the
two run the same float32 operations on the same tensors (transformers' ESM code was written from fair-esm's:
rotary, softmax(q k^T) v, GELU, LayerNorm): bit for bit. A padded batch lays its rows out [T, B] in fair-esm and
[B, T] in transformers, so each float GEMM sees its rows in another order, and transformers' default attention is
SDPA: there the outputs agree to float32 rounding (the tolerance below), never more.
"""

import json
from pathlib import Path

import pytest
import torch

import ptq_protein as pp

pytest.importorskip("transformers")

RECIPES = ["w8-only", "w8a8-uniform", "w8a8-pwlq", "w8a8-dynamic", "w4a8-pwlq"]
# float32 rounding of the differing operations (~1.2e-7 each), over two layers and the head: measured <= 4e-7
ROUNDING = 1e-5


def _tokens(alphabet, seqs):
    return alphabet.get_batch_converter()([(str(i), s) for i, s in enumerate(seqs)])[2]


@pytest.fixture(scope="module")
def artifacts(esm2, calib_seqs, tmp_path_factory):  # noqa: F811 (fixtures from conftest)
    folder = tmp_path_factory.mktemp("fair")
    out = {}
    for recipe in RECIPES:
        pp.save(pp.quantize(esm2, recipe, calibration=list(calib_seqs)), folder / recipe)
        out[recipe] = folder / recipe
    return out


@pytest.fixture
def simulation(monkeypatch):
    """Both loaders run the float simulation of record (what they choose on a CPU without exact int8 GEMMs)."""
    from ptq_protein.artifact import build as artifact_build
    from ptq_protein.recipes.config import Backend

    monkeypatch.setattr(artifact_build, "choose_backend", lambda config, device: (Backend.FAKE, "the simulation"))


def _eager_pair(folder: Path, seqs):
    """(pp.load's, from_pretrained's with eager attention) logits and last hidden states, one sequence at a time."""
    from esm.data import Alphabet
    from transformers import AutoModelForMaskedLM

    alphabet = Alphabet.from_architecture("ESM-1b")
    ours = pp.load(folder)
    theirs = AutoModelForMaskedLM.from_pretrained(folder, attn_implementation="eager")
    assert type(theirs).__name__ == "EsmForMaskedLM"
    for seq in seqs:
        tokens = _tokens(alphabet, [seq])
        with torch.no_grad():
            a = ours(tokens, repr_layers=[len(ours.layers)])
            b = theirs(input_ids=tokens, output_hidden_states=True)
        yield (a["logits"], b.logits), (a["representations"][len(ours.layers)], b.hidden_states[-1])


@pytest.mark.parametrize("recipe", RECIPES)
def test_eager_attention_gives_pp_loads_outputs_bit_for_bit(artifacts, recipe, seqs, simulation):
    for logits, hidden in _eager_pair(artifacts[recipe], seqs):
        assert torch.equal(*logits) and torch.equal(*hidden)


@pytest.mark.parametrize("recipe", RECIPES)
def test_default_backend_gives_pp_loads_outputs_to_float_rounding(artifacts, recipe, seqs):
    """Where both pick integer GEMMs (exact int32 sums), the float work around them runs in two models' code:
    fair-esm's layers and transformers' (an addition order apart: ~1e-7 relative, measured 3.5e-7 at most)."""
    for (a, b), _ in _eager_pair(artifacts[recipe], seqs):
        assert float((a - b).norm() / a.norm()) < 1e-5


@pytest.mark.parametrize("recipe", ["w8a8-uniform", "w8a8-pwlq"])
def test_default_attention_and_padded_batches_agree_to_float_rounding(artifacts, recipe, seqs):
    from esm.data import Alphabet
    from transformers import AutoModelForMaskedLM, EsmModel

    alphabet = Alphabet.from_architecture("ESM-1b")
    tokens = _tokens(alphabet, seqs)
    keep = tokens != alphabet.padding_idx
    ours = pp.load(artifacts[recipe])
    masked_lm = AutoModelForMaskedLM.from_pretrained(artifacts[recipe])
    trunk = EsmModel.from_pretrained(artifacts[recipe])
    with torch.no_grad():
        a = ours(tokens, repr_layers=[len(ours.layers)])
        logits = masked_lm(input_ids=tokens, attention_mask=keep.long()).logits
        hidden = trunk(input_ids=tokens, attention_mask=keep.long()).last_hidden_state
    for got, want in ((logits, a["logits"]), (hidden, a["representations"][len(ours.layers)])):
        rel = (got[keep] - want[keep]).norm() / want[keep].norm()
        assert float(rel) <= ROUNDING


def test_feature_extraction_pipeline_reads_the_artifact(artifacts):
    from transformers import pipeline

    features = pipeline("feature-extraction", str(artifacts["w8a8-uniform"]))("MKTAYIAK")
    ours = pp.load(artifacts["w8a8-uniform"])
    from esm.data import Alphabet

    with torch.no_grad():
        want = ours(_tokens(Alphabet.from_architecture("ESM-1b"), ["MKTAYIAK"]), repr_layers=[len(ours.layers)])
    want = want["representations"][len(ours.layers)][0]
    got = torch.tensor(features[0])
    assert got.shape == want.shape
    assert float((got - want).norm() / want.norm()) <= ROUNDING


def test_pp_load_still_gives_the_fair_esm_model(artifacts):
    model = pp.load(artifacts["w8a8-uniform"])
    assert type(model).__name__ == "ESM2"
    config = json.loads((artifacts["w8a8-uniform"] / "config.json").read_text())
    assert config["model_type"] == "esm" and config["architectures"] == ["EsmForMaskedLM"]
    assert config["quantization_config"]["quant_method"] == "ptq_protein"


def test_attention_product_recipes_and_edited_tokenizers_are_refused_in_one_line(esm2, calib_seqs, tmp_path):
    from transformers import AutoModelForMaskedLM

    pp.save(pp.quantize(esm2, "w8a8-pwlq-all", calibration=list(calib_seqs)), tmp_path / "all")
    with pytest.raises(ValueError, match="quantizes the attention products .* load it with ptq_protein.load"):
        AutoModelForMaskedLM.from_pretrained(tmp_path / "all")
    pp.save(pp.quantize(esm2, "w8-only", calibration=list(calib_seqs)), tmp_path / "w8")
    vocab = tmp_path / "w8" / "vocab.txt"
    lines = vocab.read_text().splitlines()
    lines[4], lines[5] = lines[5], lines[4]  # L <-> A
    vocab.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="tokenizer files encode letters otherwise"):
        AutoModelForMaskedLM.from_pretrained(tmp_path / "w8")
    assert type(pp.load(tmp_path / "w8")).__name__ == "ESM2"  # pp.load reads no tokenizer file
