"""The benchmarks (the bench package scripts/bench/): the --quick runs print their tables.

No timing is asserted; the checks are that each table is complete, every measured cell is a number, the
artifact round trip is bit-identical, and the whole-process rows agree with their reference programs
(fair-esm's extract.py and predict.py) where they compute the same thing.
"""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from bench_fixtures import SCRIPTS, _load_path, _table_rows

pytest.importorskip("esm")


def _load(name: str):
    return _load_path(name, SCRIPTS / f"{name}.py")


def _bench(name: str):
    """A module of the bench package (``scripts/bench/NAME.py``), imported as ``bench.NAME``."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module(f"bench.{name}")


def test_bench_quantize_quick_prints_every_table(capsys):
    bench = _bench("quantize")
    assert bench.main(["--quick", "--reps", "1", "--calib-seqs", "4"]) == 0
    out = capsys.readouterr().out
    assert "`python -m scripts.bench quantize --quick --reps 1 --calib-seqs 4`" in out
    assert "torch.set_num_threads(1)" in out
    for preset in bench.PRESETS:
        (calib,) = [r for r in _table_rows(out, preset) if len(r) == 6]
        assert re.fullmatch(r"\d+\.\d\dx", calib[4]) and calib[5].startswith("<= 1.25x: ")
        alone, fwd = [r for r in _table_rows(out, preset) if len(r) == 5]  # calibration alone, then forward
        assert re.fullmatch(r"\d+\.\d\dx", alone[3]) and alone[4].startswith("<= 1.25x: ")
        assert float(fwd[1]) > 0 and re.fullmatch(r"\d+\.\d\dx", fwd[2]) and float(fwd[3]) > 0
        (mem,) = [r for r in _table_rows(out, preset) if len(r) == 7]
        assert float(mem[1]) > 0 and float(mem[2]) > 0 and re.fullmatch(r"[+-]\d+\.\d%", mem[3])


def test_bench_quantize_rejects_bad_threads():
    with pytest.raises(SystemExit):
        _bench("quantize").parse_args(["--threads", "0"])


def test_bench_artifact_size_quick_round_trips_bit_identically(capsys):
    bench = _bench("artifact_size")
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = _table_rows(out, "ESM-2 2 layers x 64")
    assert [r[1] for r in rows] == ["fp32", *bench.GOALS]
    ratios = {r[1]: float(r[4]) for r in rows[1:]}
    assert all(r[7] == "yes" and r[8] == "logits" for r in rows[1:])
    # the tiny model is embedding-dominated, so only the ordering is structural: W4 < W8 < fp32
    assert ratios["w4-only"] < ratios["w8-only"] < 1.0
    assert ratios["w4a8-pwlq"] < ratios["w8a8-pwlq"] < 1.0


def test_bench_gptq_quick_prints_both_tables(capsys):
    assert _bench("gptq").main(["--quick", "--reps", "1", "--calib-seqs", "2"]) == 0
    out = capsys.readouterr().out
    assert "`python -m scripts.bench gptq --quick --reps 1 --calib-seqs 2`" in out
    time_row, memory_row = _table_rows(out, "gptq pass |")  # the time table, then the memory table
    assert float(time_row[1]) > 0 and re.fullmatch(r"\d+\.\dx", time_row[2])
    assert float(memory_row[2]) >= 0

def test_bench_special_tokens_prints_every_mode(capsys):
    bench = _bench("special_tokens")
    assert bench.main(["--models", "tiny-esm2", "--presets", "w8a8-uniform", "--calib", "casp14:3",
                       "--crop", "32", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    rows = {r[2]: r for r in _table_rows(out, "tiny-esm2") if len(r) == 10}  # the main table
    assert "| model | preset | site | BOS/EOS range | residue range |" in out
    assert sorted(rows) == ["clip", "float", "include"]
    assert float(rows["float"][3]) == 0.0 < float(rows["clip"][3])  # BOS/EOS rows bypass the quantizer
    assert all(float(rows[m][5]) > 0 for m in rows)  # residue rows are quantized in every mode


def test_bench_cpu_int8_quick_prints_the_issue_table(capsys):
    """One row per model with a time ratio and a logits error, skipped anchors with their note, the goals."""
    bench = _bench("cpu_int8")
    assert bench.main(["--quick", "--reps", "1", "--no-memory", "--no-anchors", "--calib-seqs", "4"]) == 0
    out = capsys.readouterr().out
    assert "oneDNN int8 exactness probe: mode " in out and "get_cpu_capability()" in out
    rows = {r[0]: r for r in _table_rows(out, "") if len(r) == 6 and r[0] != "model"}
    for name in ("FP32 eager", "FP model in bf16", *(f"{p}, {b}" for p in bench.INT_PRESETS for b in ("fake", "int8"))):
        assert re.fullmatch(r"\d+\.\d\dx", rows[name][3]) and re.fullmatch(r"\d+\.\d\d%", rows[name][5]), name
    assert rows["FP32 eager"][5] == "0.00%"
    assert "uniform int8" in out and "no slower than fake" in out


def test_ort_anchor_rows_say_whether_they_saturate():
    """ONNX Runtime's dynamic int8 MatMul is probed on the extreme code pair: reduce_range (7-bit weights) and
    U8U8 are exact on every x86 CPU, and each anchor row's name carries its probe's verdict."""
    pytest.importorskip("onnxruntime")
    anchors = _bench("cpu_anchors")
    assert anchors.ort_exact("s8", per_channel=False, reduce_range=True)
    assert anchors.ort_exact("u8", per_channel=True, reduce_range=False)
    from ptq_protein.nn import cpu_int8

    if cpu_int8.mode() == "split":  # no VNNI: ORT's u8 x s8 pairs saturate like oneDNN's, and the probe says so
        assert not anchors.ort_exact("s8", per_channel=False, reduce_range=False)
    bench = _bench("cpu_int8")
    names = [name for name, _ in bench.ort_builders(None, None, 1)]
    assert len(names) == len(bench.ORT_ROWS)
    assert all(re.search(r"\[(exact|SATURATES \(int16 pairs\))\]$", n) for n in names), names
    assert "per-tensor W (ORT's default) [exact]" in names[0]


def test_bench_long_fold_longest_brackets_each_modes_measured_longest_length(monkeypatch):
    # A fake fold whose peak is runtime + c L^2 (the fold's own memory grows as L^2), with the model's prediction
    # 10% short for FP32 (so its first fold is over the budget) and exact for int8: closed-form lengths to check.
    bench = _bench("long_fold")
    budget, runtime = 2 ** 30, 2 ** 28
    per_l2 = {"fp32-c32": 3000.0, "pair8-c16": 600.0}
    truth = {mode: int(((budget - runtime) / c) ** 0.5) for mode, c in per_l2.items()}  # longest that fits
    predicted = {"fp32-c32": int(truth["fp32-c32"] * 1.1), "pair8-c16": truth["pair8-c16"]}
    monkeypatch.setattr(bench, "longest_fitting", lambda model, mode, b: predicted[mode])

    def fold(model, mode, length, timeout):
        peak = int(runtime + per_l2[mode] * length ** 2)
        return {"model": model, "mode": mode, "length": length, "peak_bytes": peak, "rss_before": runtime,
                "predicted_bytes": peak, "seconds": 1.0}

    monkeypatch.setattr(bench, "run_row", fold)
    rows = bench.measured_longest("real2", ["fp32-c32", "pair8-c16"], budget, None)
    fp32 = [r for r in rows if r["mode"] == "fp32-c32"]
    assert not fp32[0]["fits"] and fp32[0]["length"] == predicted["fp32-c32"]
    assert any(r["fits"] for r in fp32) and all(r["fits"] == (r["length"] <= truth[r["mode"]]) for r in rows)
    assert [r["length"] for r in rows if r["mode"] == "pair8-c16"] == [truth["pair8-c16"]]  # fits: no retry
    text = bench.longest_table(rows)
    fitted = max(r["length"] for r in fp32 if r["fits"])
    assert f"fp32-c32: measured to fit at L = {fitted}, over at L = {predicted['fp32-c32']}" in text
    assert f"> {truth['pair8-c16'] / predicted['fp32-c32']:.2f}x" in text


def _imports(path: Path, known: set) -> set:
    """The bench modules ``path`` imports (top level or inside functions), by module name."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known}
    return found


def test_bench_scripts_import_no_circle():
    """Every bench module (scripts/*.py as top-level names, scripts/bench/*.py as bench.X) imports only downward:
    the import graph has no cycle (bench_embed and bench_embed_memory used to import each other)."""
    modules = {p.stem: p for p in SCRIPTS.glob("*.py")}
    modules.update({f"bench.{p.stem}": p for p in (SCRIPTS / "bench").glob("*.py") if p.stem != "__init__"})
    graph = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    state: dict = {}

    def visit(name, trail):
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", f"import circle: {' -> '.join(trail + [name])}"
        state[name] = "open"
        for dep in sorted(graph[name]):
            visit(dep, trail + [name])
        state[name] = "done"

    for name in sorted(graph):
        visit(name, [])
    assert "bench.common" in graph and graph["bench.embed"] >= {"bench.common", "bench.prepare"}


def test_random_checkpoints_load_with_fair_esm_and_carry_the_planted_channels(tmp_path):
    """make_random_checkpoints.py writes fair-esm's published layout (NAME.pt + NAME-contact-regression.pt, which
    load_model_and_alphabet_local requires) and, with --outliers, the tiny models' planted channels: the
    embedding columns and FFN output rows that plant_outlier_channels_ picks for that seed, far above the rest."""
    import argparse

    import esm
    import torch

    from ptq_protein.models.outliers import OutlierSpec

    maker = _load("make_random_checkpoints")
    torch.serialization.add_safe_globals([argparse.Namespace])
    widths = {}
    for planted in (False, True):
        folder = tmp_path / str(planted)
        folder.mkdir()
        path = maker.write_esm2("esm2_quick", folder, seed=0, outliers=planted)
        model, alphabet = esm.pretrained.load_model_and_alphabet_local(str(path))
        rows = [i for i in range(len(alphabet.all_toks)) if i != alphabet.padding_idx]  # planting zeroes padding
        widths[planted] = model.embed_tokens.weight[rows].abs().amax(dim=0)  # [C]: each channel's largest value
        assert torch.equal(model.lm_head.weight, model.embed_tokens.weight)
    spec = OutlierSpec()
    channels = torch.randperm(64, generator=torch.Generator().manual_seed(spec.seed_offset))[:spec.num_channels]
    others = torch.ones(64, dtype=torch.bool)
    others[channels] = False
    assert widths[True][channels].min() > 5 * widths[True][others].max()  # planted: scale 6 x lognormal, x5 tails
    assert torch.equal(widths[True][others], widths[False][others])  # the other channels are untouched
    assert widths[False].max() < 5 * widths[False].median()  # plain: no channel stands out


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


def test_bench_entry_point_lists_and_dispatches_every_bench(capsys):
    """``python -m scripts.bench``: every name maps to a module whose ``main`` takes argv, and has a description."""
    import ast

    bench = _load_path("bench_entry", SCRIPTS / "bench" / "__main__.py")
    for name, module in bench.BENCHES.items():
        tree = ast.parse(bench.module_file(module).read_text())
        (main,) = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"]
        assert main.args.args, f"{module}.main takes no argv"
        assert bench.describe(module), name
    assert {"embed", "score", "embed_memory", "onednn_reorders"} <= set(bench.BENCHES)
    assert bench.main(["--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(bench.BENCHES)
    assert bench.main(["no-such-bench"]) == 2
    with pytest.raises(SystemExit) as exit_:
        bench.main(["tmscore", "--help"])
    assert exit_.value.code == 0 and "--rounds" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        bench.main(["embed", "--help"])
    assert exit_.value.code == 0 and "--isa" in capsys.readouterr().out


def test_the_exported_onnx_row_runs_on_what_the_graph_takes():
    """``pp.export_onnx``'s graph takes input_ids and attention_mask and lists last_hidden_state first: the bench's
    session feeds both and reads ``logits`` (it fed input_ids alone: ``python -m scripts.bench cpu_int8 --quick``
    crashed in ONNX Runtime)."""
    pytest.importorskip("onnxruntime")
    import esm
    import torch

    import ptq_protein as pp
    from ptq_protein.models.tiny import tiny_esm2

    bench = _bench("cpu_int8")
    model = tiny_esm2(seed=0)[0]
    seqs = ["MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPVAGK", "MQIFVKTLTGKTITLEVEPSDTIENVKA"]
    tokens = esm.data.Alphabet.from_architecture("ESM-1b").get_batch_converter()(
        [(str(i), s) for i, s in enumerate(seqs)])[2]  # padded: the mask matters
    fast = pp.quantize(model, "w8a8-uniform", calibration=seqs, backend="int8")
    got = bench.exported_row(fast, tokens, 1)(tokens)["logits"]
    with torch.no_grad():
        want = fast(tokens)["logits"]
    keep = tokens != 1
    assert got.shape == want.shape
    assert float((got[keep] - want[keep]).norm() / want[keep].norm()) < 1e-2  # the same model, another engine


def test_bench_esmc_study_quick_prints_both_tables(capsys):
    bench = _bench("esmc_study")
    assert bench.main(["--quick", "--outliers", "planted", "--recipes", "w8a8-dynamic"]) == 0
    out = capsys.readouterr().out
    roles = _table_rows(out, "attention LayerNorm input") + _table_rows(out, "SwiGLU out Linear input")
    assert len(roles) == 2 and all(float(r[2]) < 0 < float(r[3]) and abs(float(r[4])) <= 1 for r in roles)
    (row,) = _table_rows(out, "w8a8-dynamic")
    assert row[1] == "int8" and re.fullmatch(r"\d+\.\d\d%", row[2]) and 0.9 < float(row[4]) <= 1.0
    assert re.search(r"best 8-bit recipe by last-layer error: w8a8-dynamic: .*\((goal >= 0\.99: (met|missed))\)", out)


def test_bench_esmc_study_splits_the_error_between_weights_and_activations(capsys):
    """--split: each half alone is a smaller error than both together (independent roundings add up);
    --no-site-table prints no per-site table."""
    bench = _bench("esmc_study")
    args = ["--quick", "--outliers", "plain", "--recipes", "w8a8-dynamic", "--split", "--no-site-table"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "Per-site activation statistics" not in out
    (row,) = _table_rows(out, "w8a8-dynamic")
    both, weights, acts = (float(row[i].rstrip("%")) for i in (2, 5, 6))
    assert 0 < weights < both and 0 < acts < both


def test_bench_esmc_embed_quick_times_the_commands_as_typed(capsys, tmp_path):
    """Without the official venv the anchors are skipped with a line saying so; the commands still run as typed,
    the FP .pth with --dtype bfloat16 exactly where the CPU has bf16, each succeeding (a rate, not a failure)."""
    bench = _bench("esmc_embed")
    missing = tmp_path / "no-venv" / "python"
    assert bench.main(["--quick", "--threads", "1", "--presets", "w8a8-dynamic", "--official-python",
                       str(missing)]) == 0
    out = capsys.readouterr().out
    assert f"official loop skipped: no {missing}" in out
    rows = _table_rows(out, "ptq-protein embed")
    names = [r[0] for r in rows]
    bf16 = "ptq-protein embed FP .pth --dtype bfloat16"
    assert names == ["ptq-protein embed FP32 .pth", *([bf16] if bench.has_bf16() else []),
                     "ptq-protein embed w8a8-dynamic artifact"]
    assert all(float(r[2]) > 0 for r in rows) and all(r[3] == r[4] == "" for r in rows)  # no anchor, no ratio
    assert "the BF16 loop" not in out


def test_bench_fold_model_is_one_esmfold_in_both_layouts_and_its_targets_span_the_range(tmp_path):
    """The fold bench's model: fair-esm's file and the transformers folder hold the same weights (the rows compare
    the same model), the stem's planted channels stand out, and the targets are the asked number within the asked
    lengths, spread from the shortest to the longest."""
    import torch
    from transformers import EsmForProteinFolding

    from ptq_protein.models.loading import load_model

    maker = _load("make_random_checkpoints")
    fold = _bench("fold")
    path = maker.write_esmfold(tmp_path, blocks=1, seed=0, outliers=True, hf=True)
    hf = EsmForProteinFolding.from_pretrained(tmp_path / (path.stem + "-hf"))
    ours = load_model(str(path)).model
    theirs = hf.state_dict()
    assert hf.config.esmfold_config.trunk.num_blocks == 1 and len(ours.trunk.blocks) == 1
    shared = [k for k in ours.state_dict() if k in theirs]
    assert len(shared) == len(theirs) and all(torch.equal(ours.state_dict()[k], theirs[k]) for k in shared)
    emb = hf.esm.embeddings.word_embeddings.weight.abs().amax(dim=0)
    assert emb.max() > 5 * emb.median()  # planted outlier channels in the stem
    chosen = fold.targets(4, 60, 150)
    lengths = [len(s) for _, s in chosen]
    assert len(chosen) == 4 and lengths == sorted(lengths) and 60 <= lengths[0] and lengths[-1] <= 150
    with pytest.raises(SystemExit, match="only"):
        fold.targets(500, 60, 150)
