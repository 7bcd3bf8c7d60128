"""The bench package's whole-process benches (scripts/bench/): children measured by their own usage, the quick
embed and score runs, oneDNN's reorder count and the HF loop's batches."""

import re
import sys

import pytest
from bench_fixtures import SCRIPTS, _load_path, _table_rows

pytest.importorskip("esm")


def test_hf_loop_batches_are_fair_esms(bench_package):
    """The plain transformers loop (it imports nothing from the toolkit) batches as users' loops do: fair-esm's
    FastaBatchedDataset.get_batch_indices, greedy filling of length-sorted sequences."""
    import random

    import esm

    loop = _load_path("hf_loop", SCRIPTS / "bench" / "loops" / "hf_loop.py")
    rng = random.Random(0)
    for budget in (64, 1000, 4096):
        lengths = [rng.randint(1, 1022) for _ in range(300)] + [5, 5, 5]
        dataset = esm.data.FastaBatchedDataset([str(i) for i in range(len(lengths))], ["A" * n for n in lengths])
        ref = dataset.get_batch_indices(budget, extra_toks_per_seq=2)  # fair-esm counts BOS only: one more here
        ours = loop.batch_plan(lengths, budget)
        assert [sorted(lengths[i] for i in b) for b in ours] == [sorted(lengths[i] for i in b) for b in ref]


def test_run_measured_reports_the_childs_own_usage(bench_package):
    """os.wait4's rusage of one child: a child that touches 256 MiB peaks above it with at least one minor fault
    per page it touched (2 MiB pages where transparent huge pages serve it); a failing child's one line is its exit
    code and last output line."""
    from bench.common import run_measured

    touch = "import numpy as np; a = np.ones(256 * 2 ** 20 // 8); print(a.sum())"
    done = run_measured([sys.executable, "-c", touch])
    assert done.returncode == 0 and done.failure() == ""
    assert done.peak_rss_kib >= 256 * 1024 and done.minor_faults >= 256 // 2
    assert done.wall_s > 0 and 0 <= done.kernel_share
    failed = run_measured([sys.executable, "-c", "import sys; print('first'); print('why it failed'); sys.exit(3)"])
    assert failed.failure() == "exit 3: why it failed"


def test_run_measured_peak_is_not_the_parents(bench_package):
    """Linux counts the memory of the process a child was forked from in the child's ru_maxrss: a child started
    straight from a 512 MiB process reported over 512 MiB. Through the launcher, an empty interpreter stays small."""
    import numpy as np
    from bench.common import run_measured

    held = np.ones(512 * 2 ** 20 // 8)  # this process now holds 512 MiB more
    done = run_measured([sys.executable, "-S", "-c", "pass"])
    assert held.sum() > 0 and done.returncode == 0 and done.peak_rss_kib < 64 * 1024



def test_children_read_the_toolkit_byte_compiled(bench_package):
    """Children import the toolkit from byte code the bench wrote once (as pip does for an installed package), not
    by compiling its sources again in every process, even where PYTHONDONTWRITEBYTECODE is set."""
    import subprocess

    from bench.common import child_env

    env = child_env(1, "native", {"PYTHONDONTWRITEBYTECODE": "1"})
    count = ("import importlib._bootstrap_external as b, os\n"
             "compiled, real = [], b.SourceLoader.source_to_code\n"
             "b.SourceLoader.source_to_code = lambda self, data, path, *a, **k: compiled.append(path) or "
             "real(self, data, path, *a, **k)\n"
             "import ptq_protein.cli.main, ptq_protein.nn.layer_int8\n"
             "print(sum(os.sep + 'ptq_protein' + os.sep in str(p) or os.sep + 'eval' + os.sep in str(p) "
             "for p in compiled))")
    done = subprocess.run([sys.executable, "-c", count], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split()[-1] == "0"

# Lines as oneDNN 3 prints them (ONEDNN_VERBOSE=1) for an int8 artifact: weight reorders at load, then GEMMs.
_VERBOSE = """onednn_verbose,v1,info,oneDNN v3.7.1 (commit 8d263e693366ef8db40acc569cc7d8edf644556d)
onednn_verbose,v1,primitive,exec,cpu,reorder,simple:any,undef,src:s8::blocked:ba::f0 dst:s8:p:blocked:AB16a64b4a::f8:zpm2,attr-scratchpad:user,,64x64,0.02
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:ab::f0 dst:f32::blocked:ba::f0,attr-scratchpad:user,,36x64,0.01
onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_vnni,undef,src:u8:a:blocked:ab::f0 wei:s8::blocked:BA16a64b4a::f8:zpm2 dst:f32:a:blocked:ab::f0,attr-scratchpad:user,,36x64:64x256,0.05
=== bench: first forward done === tokens (2, 18) engine onednn
onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_vnni,undef,src:u8:a:blocked:ab::f0 wei:s8::blocked:BA16a64b4a::f8:zpm2 dst:f32:a:blocked:ab::f0,attr-scratchpad:user,,36x64:64x256,0.05
onednn_verbose,v1,primitive,exec,cpu,reorder,simple:any,undef,src:f32::blocked:ab::f0 dst:s8::blocked:BA16a64b4a::f8:zpm2,attr-scratchpad:user,,64x256,0.03
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:ab::f0 dst:f32::blocked:ba::f0,attr-scratchpad:user,,36x64,0.01
onednn_verbose,v1,primitive,exec,cpu,eltwise,jit:avx512_core_bf16,forward_training,data:f32::blocked:ab::f0,,alg:eltwise_gelu_erf,12x256,0.004
"""  # noqa: E501  (oneDNN's lines as printed)


def test_onednn_reorders_counts_weight_reorders_after_the_first_forward(bench_package):
    from bench import onednn_reorders as probe

    phases = probe.parse_exec_lines(_VERBOSE)
    assert [len(phases["first"]), len(phases["after"])] == [3, 4]
    assert [probe.is_weight_reorder(f) for f in phases["first"]] == [True, False, False]  # s8 codes, packed
    assert [probe.is_weight_reorder(f) for f in phases["after"]] == [False, True, False, False]  # f32 -> packed s8
    assert not probe.is_weight_reorder(phases["after"][1], tokens=256)  # a dimension is the batch's rows
    assert probe.batch_rows("=== bench: first forward done === tokens (2, 18) engine onednn") == 36
    text = "\n".join(probe.report(_VERBOSE))
    assert "second forward: 4 oneDNN primitives executed, 1 weight reorders (goal 0: missed)" in text
    assert "1  matmul:brg_matmul:avx512_core_vnni" in text and "tokens (2, 18) engine onednn" in text


def _cells(out: str, label: str) -> list:
    (row,) = [r for r in _table_rows(out, "") if r[0] == label]
    return row


def test_bench_embed_quick_rows_are_whole_processes(capsys, quick_dir, bench_package):
    """`embed --quick` on a row subset: each row a whole process with wall, CPU, faults, RSS and the error read from
    its files; the FP command and the HF loop equal fair-esm's extract.py (the reference program) within 1e-4."""
    from bench import embed

    argv = ["--quick", "--dir", str(quick_dir), "--rows", "fair", "hf32", "fp", "w8a8-smoothquant", "--no-inprocess"]
    assert embed.main(argv) == 0
    out = capsys.readouterr().out
    assert "`python -m scripts.bench embed --quick" in out and "int8 GEMM:" in out and "flags:" in out
    fair = _cells(out, "fair-esm extract.py loop, FP32")
    assert fair[1] == "anchor" and fair[5] == "1.00x" and fair[13] == fair[14] == "0.00%"
    for label in ("transformers EsmModel SDPA, FP32", "ptq-protein embed CKPT"):
        row = _cells(out, label)
        assert float(row[2]) > 0 and float(row[4]) > 0 and re.fullmatch(r"\d+\.\d\dx", row[5])
        assert float(row[9]) >= float(row[8]) > 0  # CPU s: user + system
        assert re.fullmatch(r"\d+\.\d%", row[10]) and int(row[11]) > 0 and float(row[12]) > 0
        assert row[13] == row[14] == "0.00%", label  # same model, FP32: the mean vectors agree within 5e-5
    art = _cells(out, "ptq-protein embed ART (w8a8-smoothquant)")
    assert art[1] == "as typed" and re.fullmatch(r"\d+\.\d\d%", art[13]) and float(art[16]) > 0  # quantize s
    assert re.fullmatch(r"\d+\.\d\d%", art[14])  # standardized error
    assert re.search(r"`embed` of the w8a8-smoothquant artifact, as typed: vs fair-esm's loop \d+\.\d\dx "
                     r"\(goal >= 2\.5x: (met|missed)\)", out)
    assert re.search(r"kernel time <= 5% of wall in every as-typed row: (met|missed)", out)


def test_bench_score_quick_checks_itself_against_predict_py(capsys, quick_dir, bench_package):
    """`score --quick`: predict.py (whole process) and `ptq-protein score` on the FP checkpoint give the same
    scores (Spearman 1, tiny differences), the artifact's drift is reported, and every goal is judged."""
    from bench import score

    assert score.main(["--quick", "--dir", str(quick_dir), "--no-inprocess"]) == 0
    out = capsys.readouterr().out
    predict = _cells(out, "fair-esm predict.py, masked-marginals, FP32")
    assert predict[4] == "1.00x" and float(predict[9]) > 0.9999 and float(predict[10]) < 1e-3
    art = _cells(out, "ptq-protein score ART (w8a8-smoothquant)")
    assert -1 <= float(art[9]) <= 1 and float(art[11]) > 0
    assert re.search(r"ptq-protein score CKPT: vs predict.py \d+\.\d\dx \(goal >= 2\.0x: (met|missed)\)", out)
    assert re.search(r"drift Spearman -?\d\.\d{4} \(goal >= 0\.99: (met|missed)\)", out)


def test_inprocess_score_rows_time_every_model(tmp_path, quick_dir, bench_package):
    """The in-process child's score subcommand, run in this process: every row timed, JSON written."""
    import json

    from bench import inprocess, prepare

    model = prepare.bench_model(quick_dir, "quick", "outliers")
    out = tmp_path / "ip.json"
    assert inprocess.main(["score", "--checkpoint", str(model.checkpoint), "--sequence", "MKTAYIAKQRQISFV",
                           "--reps", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert sorted(data["seconds"]) == ["library masked-marginals, FP32",
                                       "predict.py loop (one masked forward each), FP32"]
    assert all(s > 0 for s in data["seconds"].values())
