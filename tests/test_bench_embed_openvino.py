"""The embed bench against OpenVINO: the random checkpoints' outlier shapes, the per-channel standardized error,
the fast and accurate points, the OpenVINO loop's tokenizer and its quick whole-process rows.

No timing is asserted; each shape's signature is measured on the written checkpoint by this file's own code,
independently of the planters.
"""

import re
import sys

import pytest
from bench_fixtures import SCRIPTS, _bench, _load, _load_path, _table_rows

pytest.importorskip("esm")


def _shape_measures(model, alphabet, sequences):
    """Measured on real tokens, independently of the planters: the largest LayerNorm-output channel (inputs of
    q_proj and fc1) over the median channel, the largest residual-stream channel kurtosis, BOS's hidden-state norm
    over the median token's (smallest over layers), and the mean attention weight on BOS."""
    import torch

    from ptq_protein.models.tokens import tokenize_fair_esm

    tokens, mask = tokenize_fair_esm(alphabet, sequences)
    inputs, handles = {}, []

    def keep(name, args):
        inputs[name] = args[0].transpose(0, 1)[mask].double()

    for name, module in model.named_modules():
        if name.endswith(("q_proj", "fc1")):
            handles.append(module.register_forward_pre_hook(lambda mod, args, name=name: keep(name, args)))
    try:
        with torch.no_grad():
            out = model(tokens, repr_layers=list(range(model.num_layers + 1)), need_head_weights=True)
    finally:
        for handle in handles:
            handle.remove()
    widest = min(float(x.abs().amax(0).max() / x.abs().amax(0).median()) for x in inputs.values())
    states = [out["representations"][i].double() for i in range(model.num_layers)]
    kurtosis = max(float(channel_kurtosis(h[mask]).max()) for h in states)
    bos = min(float(h[:, 0].norm(dim=-1).median() / h[mask].norm(dim=-1).median()) for h in states)
    attention = out["attentions"][..., 0].transpose(1, 3)[mask].mean()  # (B, H, L, T, T) -> queries of real tokens
    return {"ln": widest, "kurtosis": kurtosis, "bos": bos, "attention": float(attention)}


def channel_kurtosis(x):
    centered = x - x.mean(0)
    return centered.pow(4).mean(0) / centered.pow(2).mean(0).pow(2)


@pytest.mark.parametrize("shape", ["plain", "residual", "ln-gain", "sink", "mix"])
def test_random_checkpoint_outlier_shapes_do_what_they_claim(tmp_path, shape):
    """Each outlier shape, written by make_random_checkpoints.py and loaded by fair-esm, shows its own signature and
    the others' absence where the shape promises it; the HF folder equals the fair-esm file; the same seed writes
    the same weights and another seed others."""
    import argparse

    import esm
    import torch

    from ptq_protein.data.sets import load_set

    maker = _load("make_random_checkpoints")
    prepare = _bench("prepare")
    torch.serialization.add_safe_globals([argparse.Namespace])
    path = maker.write_esm2("esm2_quick", tmp_path, seed=0, outliers=shape, hf=True)
    model, alphabet = esm.pretrained.load_model_and_alphabet_local(str(path))
    prepare.check_hf_matches(prepare.BenchModel("quick", shape, path, tmp_path / f"{path.stem}-hf", 2, 64, 4))
    got = _shape_measures(model.eval(), alphabet, [s[:100] for s in load_set("cameo139:6").sequences()])
    parts = {"mix": {"residual", "ln-gain", "sink"}, "plain": set()}.get(shape, {shape})
    assert (got["kurtosis"] > 15) == bool(parts & {"residual", "sink"}), got  # plain, ln-gain: residual stays plain
    assert got["ln"] > 15 if "ln-gain" in parts else got["ln"] < 12, got  # residual channels show, bounded, after LN
    assert (got["attention"] > 0.15) == ("sink" in parts), got  # uniform over ~100 tokens: 0.01
    assert (got["bos"] > 2.5) == bool(parts & {"residual", "sink"}), got
    if shape == "sink":
        assert got["bos"] > 10, got
    same, other = (maker.esm2_state("esm2_quick", seed, shape) for seed in (0, 1))
    assert all(torch.equal(a, b) for a, b in zip(maker.esm2_state("esm2_quick", 0, shape).values(), same.values()))
    assert not torch.equal(same["embed_tokens.weight"], other["embed_tokens.weight"])


def test_standardized_error_sees_what_one_huge_channel_hides():
    """Reference rows (1000, 1, -1) and (1002, -1, 1): per-channel mean (1001, 0, 0), population std (1, 1, 1), so
    the standardized reference is +-1 everywhere (norm sqrt(6)). A 10% error in the two small channels changes
    them by 0.1 each: standardized error 0.2 / sqrt(6); the mean-vector error divides 0.2 by the huge channel's
    norm sqrt(1000^2 + 1002^2 + 4). A constant channel keeps scale 1 (StandardScaler's rule)."""
    import math

    import torch

    errors = _bench("embed_errors")
    a = torch.tensor([[1000.0, 1.0, -1.0], [1002.0, -1.0, 1.0]])
    b = a * torch.tensor([1.0, 1.1, 1.1])
    assert errors.standardized_error(a, b) == pytest.approx(0.2 / math.sqrt(6), rel=1e-6)
    assert errors.relative_error(a, b) == pytest.approx(0.2 / math.sqrt(1000 ** 2 + 1002 ** 2 + 4), rel=1e-6)
    flat = torch.tensor([[5.0, 1.0], [5.0, 3.0]])  # channel 0 constant: (x - 5) / 1; channel 1: mean 2, std 1
    assert errors.standardized_error(flat, flat + torch.tensor([0.5, 0.0])) == pytest.approx(
        math.sqrt(2 * 0.25) / math.sqrt(2), rel=1e-6)
    assert math.isnan(errors.standardized_error(a[:1], b[:1]))  # one sequence: nothing to standardize by
    with pytest.raises(ValueError, match="N, D"):
        errors.standardized_error(a, b[:, :2])


def _result(rows, key, kind, cpu):
    from bench.common import Measured

    result = rows.RowResult(rows.Row(key, f"row {key}", kind))
    result.runs = [Measured(wall_s=2 * cpu, user_s=cpu - 0.5, sys_s=0.5, minor_faults=1, peak_rss_kib=1, returncode=0)]
    return result


def test_openvino_points_name_the_rows_on_each_point_or_the_gap():
    """Fast point: an as-typed row with CPU (user + system) and error both <= ov8's; accurate: error <= max(1%,
    ov's) and CPU <= ov's. Anchors never count; without the OpenVINO rows the points are not judged."""
    table, rows, errors = _bench("embed_table"), _bench("process_rows"), _bench("embed_errors")
    results = {"ov8": _result(rows, "ov8", "anchor", 10.0), "ov": _result(rows, "ov", "anchor", 20.0),
               "hf32": _result(rows, "hf32", "anchor", 1.0), "a": _result(rows, "a", "as typed", 8.0),
               "b": _result(rows, "b", "as typed", 30.0), "c": _result(rows, "c", "as typed", 15.0)}
    err = {"ov8": 0.03, "ov": 0.004, "hf32": 0.0, "a": 0.02, "b": 0.0, "c": 0.009}
    found = {k: errors.RowError(v, 2 * v) for k, v in err.items()}
    fast, accurate = table.openvino_points(results, found)
    assert fast.startswith("- fast point (CPU <= ov8's 10.0 s and mean-vector error <= 3.00%): on it: row a")
    assert "<= 1.00%" in accurate and accurate.endswith("on it: row c")  # b is within the bound but costs 30 s
    found["c"] = errors.RowError(0.05, 0.1)
    assert table.openvino_points(results, found)[1].endswith("none; nearest row b, error within the bound at 1.50x "
                                                             "ov's CPU")
    del results["ov8"]
    assert table.openvino_points(results, found)[0] == "- fast point: not judged (ov8 did not run here)"
    assert "hf32 0.00% / 0.00%" in table.error_line("plain", results, found)


def test_ov_loop_tokenizes_as_esm_tokenizer(tmp_path):
    """The OpenVINO loop's plain tokenizer (vocab.txt, no transformers) gives EsmTokenizer's ids and mask."""
    import torch

    from ptq_protein.models.tokens import esm_tokenizer

    sys.path.insert(0, str(SCRIPTS / "bench" / "loops"))
    loop = _load_path("ov_loop", SCRIPTS / "bench" / "loops" / "ov_loop.py")
    esm_tokenizer().save_pretrained(tmp_path)
    sequences = ["MKTAYIAKQRQISFV", "MENDELXBUZO", "A"]
    ours = loop.PlainTokenizer(tmp_path / "vocab.txt")(sequences)
    theirs = esm_tokenizer()(sequences, padding=True, return_tensors="pt")
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert torch.equal(ours["attention_mask"], theirs["attention_mask"])


def test_bench_embed_quick_runs_the_openvino_anchors(capsys, tmp_path):
    """`embed --quick --rows ov32 ov ov8 fp`: the IR made once (its seconds in "quantize s"), every OpenVINO row a
    whole process writing extract.py's files; OpenVINO FP32 equals fair-esm's loop within 1e-4; both points and
    the errors line are printed."""
    import json

    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    embed = _bench("embed")
    argv = ["--quick", "--dir", str(tmp_path / "models"), "--weights", "plain", "--rows", "ov32", "ov", "ov8", "fp",
            "--no-inprocess", "--json", str(tmp_path / "out.json")]
    assert embed.main(argv) == 0
    out = capsys.readouterr().out
    (measured,) = json.loads((tmp_path / "out.json").read_text())
    assert measured["errors"]["ov32"] < 1e-4 and measured["standardized_errors"]["ov32"] < 1e-4
    assert 0 < measured["errors"]["ov8"] < 0.5 and {"openvino:convert", "openvino:nncf"} <= set(measured["quantize"])
    for label in ("OpenVINO FP32", "OpenVINO, default config", "OpenVINO INT8, NNCF (SmoothQuant alpha 0.5, 8 "):
        (row,) = _table_rows(out, label)
        assert row[1] == "anchor" and float(row[9]) > 0 and re.fullmatch(r"\d+\.\d\d%", row[14])
        assert float(row[16]) > 0  # quantize s: the conversion (and NNCF)
    assert re.search(r"- fast point \(CPU <= ov8's \d+\.\d s and mean-vector error <= \d+\.\d\d%\): ", out)
    assert re.search(r"- accurate point \(CPU <= ov's \d+\.\d s and mean-vector error <= \d+\.\d\d%\): ", out)
    assert "- errors on plain weights (mean-vector / standardized): fair 0.00% / 0.00%" in out
