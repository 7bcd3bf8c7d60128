"""scripts/bench_quantize.py and scripts/bench_artifact_size.py: the --quick runs print their tables.

No timing is asserted; the checks are that each table is complete, every
measured cell is a number, and the artifact round trip is bit-identical.
"""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
pytest.importorskip("esm")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _table_rows(out: str, first_cell: str) -> list:
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith(f"| {first_cell}")]


def test_bench_quantize_quick_prints_every_table(capsys):
    bench = _load("bench_quantize")
    assert bench.main(["--quick", "--reps", "1", "--calib-seqs", "4"]) == 0
    out = capsys.readouterr().out
    assert "`python scripts/bench_quantize.py --quick --reps 1 --calib-seqs 4`" in out
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
        _load("bench_quantize").parse_args(["--threads", "0"])


def test_bench_artifact_size_quick_round_trips_bit_identically(capsys):
    bench = _load("bench_artifact_size")
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
    assert _load("bench_gptq").main(["--quick", "--reps", "1", "--calib-seqs", "2"]) == 0
    out = capsys.readouterr().out
    assert "`python scripts/bench_gptq.py --quick --reps 1 --calib-seqs 2`" in out
    time_row, memory_row = _table_rows(out, "gptq pass |")  # the time table, then the memory table
    assert float(time_row[1]) > 0 and re.fullmatch(r"\d+\.\dx", time_row[2])
    assert float(memory_row[2]) >= 0

def test_bench_special_tokens_prints_every_mode(capsys):
    bench = _load("bench_special_tokens")
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
    bench = _load("bench_cpu_int8")
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
    anchors = _load("bench_cpu_anchors")
    assert anchors.ort_exact("s8", per_channel=False, reduce_range=True)
    assert anchors.ort_exact("u8", per_channel=True, reduce_range=False)
    from ptq_protein.nn import cpu_int8

    if cpu_int8.mode() == "split":  # no VNNI: ORT's u8 x s8 pairs saturate like oneDNN's, and the probe says so
        assert not anchors.ort_exact("s8", per_channel=False, reduce_range=False)
    bench = _load("bench_cpu_int8")
    names = [name for name, _ in bench.ort_builders(None, None, 1)]
    assert len(names) == len(bench.ORT_ROWS)
    assert all(re.search(r"\[(exact|SATURATES \(int16 pairs\))\]$", n) for n in names), names
    assert "per-tensor W (ORT's default) [exact]" in names[0]


def test_bench_long_fold_longest_brackets_each_modes_measured_longest_length(monkeypatch):
    # A fake fold whose peak is runtime + c L^2 (the fold's own memory grows as L^2), with the model's prediction
    # 10% short for FP32 (so its first fold is over the budget) and exact for int8: closed-form lengths to check.
    bench = _load("bench_long_fold")
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


def test_bench_embed_quick_judges_every_goal(capsys):
    """Every row timed with its anchors, each 8-bit row's error, the score table and every goal judged."""
    bench = _load("bench_embed")
    assert bench.main(["--quick", "--threads", "1", "--presets", "w8a8-uniform", "w8a8-pwlq"]) == 0
    out = capsys.readouterr().out
    assert "avx" in out.lower() or "flags" in out.lower()  # the CPU's flags head the table
    rows = {r[0]: r for r in _table_rows(out, "") if len(r) == 6 and r[1] != "residues/s" and r[1] != "---"}
    anchors = [name for name in rows if name.endswith("[anchor]")]
    assert len(anchors) == 3 and rows[anchors[0]][2] == "1.00x"
    quantized = [r for name, r in rows.items() if "artifact, int8" in name]
    assert len(quantized) == 2 and all(re.fullmatch(r"\d+\.\d\d%", r[5]) for r in quantized)
    assert all(float(r[1]) > 0 and re.fullmatch(r"\d+\.\d%", r[4]) for name, r in rows.items()
               if name.startswith("embed"))
    assert re.search(r"goal >= 1\.6x: (met|missed)\), \d+\.\d\dx HF SDPA \(goal >= 1\.15x: (met|missed)", out) or \
        "throughput goals missed" in out
    score = [r for r in _table_rows(out, "") if len(r) == 4 and r[1] not in ("seconds", "---")]
    assert [r[0].split(",")[-1].strip() for r in score[1:]] == ["FP32", "w8a8-uniform", "w8a8-pwlq"]
    drift = float(score[-1][3])
    assert 0.9 < drift <= 1.0  # random weights: a toolkit check (w8a8-pwlq keeps the ranking of mutants)
    assert re.search(r"w8a8-pwlq drift Spearman \d\.\d{4} \(goal >= 0\.99: (met|missed)\)", out)


def test_bench_entry_point_lists_and_dispatches_every_bench(capsys):
    """``python -m scripts.bench``: every name maps to a script whose ``main`` takes argv, and has a description."""
    import ast

    bench = _load("bench")
    for name, module in bench.BENCHES.items():
        tree = ast.parse((SCRIPTS / f"{module}.py").read_text())
        (main,) = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"]
        assert main.args.args, f"{module}.main takes no argv"
        assert bench.describe(module), name
    assert bench.main(["--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(bench.BENCHES)
    assert bench.main(["no-such-bench"]) == 2
    with pytest.raises(SystemExit) as exit_:
        bench.main(["tmscore", "--help"])
    assert exit_.value.code == 0 and "--rounds" in capsys.readouterr().out


def test_bench_esmc_study_quick_prints_both_tables(capsys):
    bench = _load("bench_esmc_study")
    assert bench.main(["--quick", "--outliers", "planted", "--recipes", "w8a8-dynamic"]) == 0
    out = capsys.readouterr().out
    roles = _table_rows(out, "attention LayerNorm input") + _table_rows(out, "SwiGLU out Linear input")
    assert len(roles) == 2 and all(float(r[2]) < 0 < float(r[3]) and abs(float(r[4])) <= 1 for r in roles)
    (row,) = _table_rows(out, "w8a8-dynamic")
    assert row[1] == "int8" and re.fullmatch(r"\d+\.\d\d%", row[2]) and 0.9 < float(row[4]) <= 1.0
    assert re.search(r"best 8-bit recipe by last-layer error: w8a8-dynamic: .*\((goal >= 0\.99: (met|missed))\)", out)
