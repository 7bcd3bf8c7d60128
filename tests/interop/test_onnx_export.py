"""ONNX export: ONNX Runtime runs the QDQ graph within a stated bound of our fake simulation, on padded batches.

Bound (BENCHMARKS.md), relative Frobenius error over the non-padding positions, per recipe and family:
``max(1e-5, 0.1 x the recipe's own error against the float model)``. Codes are uint8 on both sides, so
ORT's x86 integer kernels (no VNNI here) are exact and most batches land near 1e-7; what is left is ORT's
float LayerNorm / GELU / softmax rounding differently from PyTorch's, which now and then moves an
activation across a rounding boundary: that value's code changes by one step (seen: 4e-3 on one of four
random sequences, against 5.8e-2 quantization error). A wrong scale, zero point or BOS/EOS rule costs
about the quantization error itself, far above the bound.
"""

import builtins

import pytest
import torch

import ptq_protein as pp
from ptq_protein.errors import InputError
from ptq_protein.models.adapters import get_adapter

pytest.importorskip("onnxruntime")
from ptq_protein.interop.onnx_export import export_onnx, ort_session  # noqa: E402

FLOOR, SHARE = 1e-5, 0.1


def _rel(got, want, keep):
    got = torch.as_tensor(got)
    return ((got - want)[keep].norm() / want[keep].norm()).item()


def _bound(fake, fp, keep):
    return max(FLOOR, SHARE * _rel(fake, fp, keep))


def _export(model, recipe, seqs, tmp_path, **kwargs):
    q = pp.quantize(model, recipe, calibration=seqs, **kwargs)
    pp.save(q, tmp_path / "a")
    export_onnx(tmp_path / "a", tmp_path / "m.onnx")
    return pp.load(tmp_path / "a"), ort_session(tmp_path / "m.onnx", threads=1)


@pytest.mark.parametrize("recipe", ["w8a8-uniform", "w8a8-dynamic", "w8-only"])
@pytest.mark.parametrize("family", ["esm2", "hf_esm2"])
def test_onnx_runtime_matches_the_fake_model(request, seqs, tmp_path, family, recipe):
    fp = request.getfixturevalue(family)
    ref, session = _export(fp, recipe, seqs, tmp_path)
    adapter = get_adapter(ref)
    batch = adapter.make_batch(seqs)  # five lengths: a padded batch, longer than the traced one
    ids = batch.inputs.get("tokens", batch.inputs.get("input_ids"))
    want, fp_out = (_logits(adapter.forward(m, batch)) for m in (ref, fp))
    got = session.run(None, {"input_ids": ids.numpy()})[0]
    assert got.shape == tuple(want.shape)
    assert _rel(got, want, ids != 1) <= _bound(want, fp_out, ids != 1)


def _logits(out):
    with torch.no_grad():
        return out["logits"] if isinstance(out, dict) else out.logits


def test_esmfold_stem_exports(esmfold, seqs, tmp_path):
    ref, session = _export(esmfold, "w8a8-uniform", seqs[:2], tmp_path, num_recycles=0)
    ids = get_adapter(ref.esm).make_batch(seqs[:3]).inputs["input_ids"]

    def stem(model):  # what ESMFold's trunk reads: [B, T, layers + 1, C]
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=ids != 1, output_hidden_states=True)
        return torch.stack(out.hidden_states, dim=2)

    want = stem(ref.esm)
    got = session.run(None, {"input_ids": ids.numpy()})[0]
    assert _rel(got, want, ids != 1) <= _bound(want, stem(esmfold.esm), ids != 1)


@pytest.mark.parametrize("recipe, words", [("w8a8-pwlq", "PWLQ activations are not exported"),
                                           ("w4-only", "weights are 4-bit")])
def test_unexpressible_recipes_refused_naming_the_site(esm2, seqs, tmp_path, recipe, words):
    q = pp.quantize(esm2, recipe, calibration=seqs)
    pp.save(q, tmp_path / "a")
    with pytest.raises(InputError, match=rf"^site [\w.]+: {words}") as err:
        export_onnx(tmp_path / "a", tmp_path / "m.onnx")
    assert "\n" not in str(err.value) and not (tmp_path / "m.onnx").exists()


def test_without_onnx_one_line_says_to_install(esm2, tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_onnx(name, *args, **kwargs):
        if name.split(".")[0] in ("onnx", "onnxruntime"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnx)
    with pytest.raises(InputError, match=r"pip install 'ptq-protein\[onnx\]'"):
        export_onnx(tmp_path / "missing", tmp_path / "m.onnx")


def test_cli_export(esm2, seqs, tmp_path, capsys):
    from ptq_protein.cli.main import main

    pp.save(pp.quantize(esm2, "w8a8-dynamic"), tmp_path / "a")
    assert main(["export", str(tmp_path / "a"), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]) == 0
    assert (tmp_path / "m.onnx").stat().st_size > 0 and "wrote" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "a"), "--out", str(tmp_path / "m.onnx")]) == 2  # exists, no --force
