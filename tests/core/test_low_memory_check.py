"""``quantize --low-memory`` (asked, or chosen because only it fits) runs the default mode's fidelity check: the
float model's outputs on the check's sequences are streamed layer by layer too, so a recipe that breaks the model
exits 3 and the artifact records the verdict, as in memory."""

import json

import pytest
import torch

from ptq_protein.cli.main import main
from ptq_protein.eval.bench.fidelity import reference_outputs
from ptq_protein.models.fair_esm2 import save_fair_esm2
from ptq_protein.models.loading import load_model
from ptq_protein.models.tiny import build_tiny
from ptq_protein.workflows.streaming import quantize_streaming_checked

SEQS = ["MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPVAGK", "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEG"]


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A model a per-tensor activation quantizer breaks: one LayerNorm channel at 1e4, read through zero weight
    columns (its float output is the plain model's)."""
    model = build_tiny("tiny-esm2", seed=1)[0]
    with torch.no_grad():
        for layer in model.layers:
            attn = layer.self_attn
            for norm, linears in ((layer.self_attn_layer_norm, (attn.q_proj, attn.k_proj, attn.v_proj)),
                                  (layer.final_layer_norm, (layer.fc1,))):
                norm.bias[0] = 1e4
                for linear in linears:
                    linear.weight[:, 0] = 0
    return save_fair_esm2(model, tmp_path_factory.mktemp("broken") / "esm2_t6_8M_UR50D.pt", regression="inline")


def test_streamed_references_are_the_whole_models(broken):
    _, refs = quantize_streaming_checked(broken, "w8a8-uniform", SEQS, SEQS[:2], batch_size=2)
    want = reference_outputs(load_model(broken).model, SEQS[:2])
    for got, ref in zip(refs, want):
        assert torch.equal(got.batch.inputs["tokens"], ref.batch.inputs["tokens"])
        torch.testing.assert_close(got.output, ref.output, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("how", ["--low-memory", "chosen"])
def test_a_broken_recipe_exits_3_under_low_memory_as_in_memory(broken, tmp_path, monkeypatch, capsys, how):
    common = ["quantize", str(broken), "--preset", "w8a8-uniform", "--calib", "casp14:4", "--quiet"]
    assert main(common + ["--out", str(tmp_path / "memory")]) == 3
    if how == "chosen":
        from test_low_memory import _between_the_modes

        _between_the_modes(monkeypatch)
    assert main(common + ["--out", str(tmp_path / "low"), *([how] if how.startswith("--") else [])]) == 3
    assert "this exits with code 3" in capsys.readouterr().err
    memory, low = (json.loads((tmp_path / name / "recipe.json").read_text())["fidelity"] for name in ("memory", "low"))
    assert not low["verdict"]["within"] and low["verdict"]["outside"] == memory["verdict"]["outside"]
    assert low["relative_error"] == pytest.approx(memory["relative_error"], rel=1e-4)
