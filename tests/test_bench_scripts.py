"""The benchmarks (the bench package scripts/bench/): the --quick runs print their tables.

No timing is asserted; the checks are that each table is complete, every measured cell is a number, the
artifact round trip is bit-identical, and the whole-process rows agree with their reference programs
(fair-esm's extract.py and predict.py) where they compute the same thing.
"""

import re
from pathlib import Path

import pytest
from bench_fixtures import SCRIPTS, _bench, _load, _load_path, _table_rows

pytest.importorskip("esm")


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


def test_a_bench_recipe_with_an_alpha_quantizes_with_that_option(monkeypatch, tmp_path):
    """``PRESET@A`` in ``--recipes``: ``quantize --preset PRESET --smoothquant-alpha A``; a plain name adds none."""
    prepare = _bench("prepare")
    seen = []
    monkeypatch.setattr(prepare, "run_measured", lambda argv, env, log=None: seen.append(argv))
    prepare.quantize(tmp_path / "m.pt", "w8a8-smoothquant@auto", tmp_path / "a", {})
    prepare.quantize(tmp_path / "m.pt", "w8a8-smoothquant", tmp_path / "b", {})
    assert seen[0][-6:] == ["--preset", "w8a8-smoothquant", "--smoothquant-alpha", "auto", "--out", str(tmp_path / "a")]
    assert seen[1][-4:] == ["--preset", "w8a8-smoothquant", "--out", str(tmp_path / "b")]
