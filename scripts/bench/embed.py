"""``ptq-protein embed`` as users type it, whole processes, against the loops users run instead (and in-process rows).

Every row is one process over the same FASTA, doing the same output work: one extract.py-style ``LABEL.pt``
(mean of the last layer) per sequence. Each is timed from start to exit (model load included), with the
child's user and system CPU, minor page faults and peak RSS (``os.wait4``). Rows run once untimed first (the
warm-up; it is also the cold run, inductor's cache starting empty, reported as "first run"), then ``--reps``
interleaved rounds in rotating order; the median is kept. Rows:

* anchors: fair-esm's ``extract.py`` (FP32; ``loops/extract.py``) and the same with ``quantize_dynamic``;
  transformers ``EsmModel`` SDPA in FP32 and, where the CPU has bf16 (avx512_bf16 or amx_bf16), BF16, over the
  embed command's batches (``loops/hf_loop.py``); our ONNX export of the recommended artifact in ONNX Runtime;
  torchao's PT2E static W8A8 (``X86InductorQuantizer``) compiled by inductor; OpenVINO (``loops/ov_loop.py``, the
  HF loop's batches and output) on an IR converted from the HF folder: FP32 (``INFERENCE_PRECISION_HINT`` f32),
  its default config (bf16 where the CPU has it) and NNCF's INT8 (SmoothQuant, ``--ov-calib-seqs`` calibration
  sequences); the conversion and NNCF are whole processes made once (``loops/ov_convert.py``), their seconds in
  the "quantize s" column (the INT8 row's: conversion plus NNCF);
* as typed: ``ptq-protein embed CKPT FASTA --out DIR`` (and ``--dtype bfloat16``), and for each recipe
  ``ptq-protein quantize CKPT --preset R --out ART`` (its own column) then ``ptq-protein embed ART FASTA --out
  DIR``; the HF-folder route: ``embed HF_FOLDER`` and the recommended recipe quantized from that folder;
* in-process (``inprocess.py embed``): models loaded once, only the loops timed.

Model: a random ESM-2 checkpoint in fair-esm's published layout and the same weights as an HF folder
(``prepare.py``), checked equal first. Random weights: a toolkit measurement, not biology. Workload: the first
``--seqs`` bundled sequences (CAMEO first: 120 is the issue's 33,066 residues), whole.

    python -m scripts.bench embed --quick                 # tiny model, 8 short sequences, every row once but torchao's
    python -m scripts.bench embed --quick --rows pt2e     # torchao's row alone (a cold compile)
    python -m scripts.bench embed --quick --rows ov32 ov ov8 hf32 fp --weights plain ln-gain   # against OpenVINO
    python -m scripts.bench embed --size 35m --threads 1 2 --isa native avx2 --reps 3
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

from bench import embed_errors, embed_table, prepare
from bench.common import (
    ISAS,
    bench_command,
    bundled_records,
    child_cpu_facts,
    child_env,
    isa_label,
    run_measured,
    versions,
    write_fasta,
)
from bench.inprocess import artifact_args, run_child
from bench.process_rows import OUT, Row, run_rows

ISSUE_SEQS = 120  # the first 120 bundled CAMEO sequences: 33,066 residues
QUICK_SEQS, QUICK_LENGTH = 8, 60


def cpu_flags() -> set:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))


def bf16_absent(isa: str) -> str:
    """'' where the HF BF16 anchor runs, else why not."""
    if isa == "avx2":
        return "absent: AVX2-held (the emulated CPU has no bf16)"
    return "" if {"avx512_bf16", "amx_bf16"} & cpu_flags() else "absent: the CPU lists neither avx512_bf16 nor amx_bf16"


def torchao_absent(python: str) -> str:
    """'' when ``python`` imports torchao, else why the PT2E row is absent."""
    if python == sys.executable:
        return "" if importlib.util.find_spec("torchao") else "absent: torchao not installed (pip install torchao)"
    done = run_measured([python, "-c", "import torchao"])
    return "" if done.returncode == 0 else f"absent: {python} cannot import torchao ({done.failure()})"


def embed_rows(model: prepare.BenchModel, fasta: Path, calib: Path, arts: Dict, onnx: Union[Path, str],
               isa: str, args) -> List[Row]:
    """Every whole-process row of one configuration (absent ones carry the reason; ``onnx``: the exported file,
    or why there is none)."""
    py, cli, recommended = sys.executable, prepare.cli(), args.recommended
    extract = (py, prepare.loop_script("extract"), str(model.checkpoint), str(fasta), f"{OUT}/emb", "--include", "mean")
    hf = (py, prepare.loop_script("hf_loop"), str(model.hf_folder), str(fasta), f"{OUT}/emb")
    bf16 = bf16_absent(isa)
    torchao = torchao_absent(args.torchao_python)
    if args.quick and "pt2e" not in args.rows and not torchao:
        torchao = "skipped by --quick (its cold compile alone takes about a minute): add --rows pt2e to run it"
    rows = [Row("fair", "fair-esm extract.py loop, FP32", "anchor", extract),
            Row("hf32", "transformers EsmModel SDPA, FP32", "anchor", hf),
            Row("hf16", "transformers EsmModel SDPA, BF16", "anchor", hf + ("--bf16",), absent=bf16),
            Row("dyn", "torch.ao quantize_dynamic in extract.py's loop", "anchor", extract + ("--quantize-dynamic",)),
            Row("ort", f"ONNX Runtime, our export of {recommended}", "anchor", hf + ("--onnx", str(onnx)),
                absent=onnx if isinstance(onnx, str) else ""),
            Row("pt2e", "torchao X86InductorQuantizer PT2E W8A8 (Linear), torch.compile", "anchor",
                (args.torchao_python, *hf[1:], "--pt2e", str(calib)), absent=torchao, compiles=True),
            Row("fp", "ptq-protein embed CKPT", "as typed", (*cli, "embed", str(model.checkpoint), str(fasta),
                                                              "--out", f"{OUT}/emb")),
            Row("fp-bf16", "ptq-protein embed CKPT --dtype bfloat16", "as typed",
                (*cli, "embed", str(model.checkpoint), str(fasta), "--out", f"{OUT}/emb", "--dtype", "bfloat16"),
                absent=bf16)]
    engine = prepare.openvino_absent(False) or _engine_absent()
    for recipe in args.recipes:
        art = arts.get(("ckpt", recipe))
        typed = (*cli, "embed", str(art), str(fasta), "--out", f"{OUT}/emb")
        made = "" if art else "absent: quantize failed (see the quantize line)"
        rows.append(Row(f"art:ckpt:{recipe}", f"ptq-protein embed ART ({recipe})", "as typed", typed, absent=made))
        rows.append(Row(f"ov-art:ckpt:{recipe}", f"ptq-protein embed ART --engine openvino ({recipe})", "as typed",
                        (*typed, "--engine", "openvino"), absent=made or engine))
    rows.append(Row("hf-fp", "ptq-protein embed HF_FOLDER", "as typed",
                    (*cli, "embed", str(model.hf_folder), str(fasta), "--out", f"{OUT}/emb")))
    art = arts.get(("hf", recommended))
    rows.append(Row(f"art:hf:{recommended}", f"ptq-protein embed ART ({recommended}, quantized from HF_FOLDER)",
                    "as typed", (*cli, "embed", str(art), str(fasta), "--out", f"{OUT}/emb"),
                    absent="" if art else "absent: quantize failed (see the quantize line)"))
    return rows


def openvino_rows(model: prepare.BenchModel, fasta: Path, irs: Mapping[str, Union[Path, str]], args) -> List[Row]:
    """The OpenVINO anchors on ``irs`` ({row key: IR or why absent}, :func:`prepare.openvino_irs`)."""
    labels = {"ov32": "OpenVINO FP32 (INFERENCE_PRECISION_HINT f32)", "ov": "OpenVINO, default config",
              "ov8": f"OpenVINO INT8, NNCF (SmoothQuant alpha {args.ov_alpha:g}, {args.ov_calib_seqs} calibration "
                     "sequences)"}
    rows = []
    for key, ir in irs.items():
        cmd = (sys.executable, prepare.loop_script("ov_loop"), str(model.hf_folder), str(fasta), f"{OUT}/emb",
               "--ir", str(ir), *(("--f32",) if key == "ov32" else ()))
        rows.append(Row(key, labels[key], "anchor", cmd, absent=ir if isinstance(ir, str) else ""))
    return rows


def _engine_absent() -> str:
    """'' where ``embed --engine openvino`` runs on this CPU, else why its rows are absent."""
    from ptq_protein.interop.openvino_engine import why_not

    why = why_not("cpu")
    return f"absent: {why}" if why else ""


def selected(args, key: str) -> bool:
    """Whether ``--rows`` keeps the row ``key`` (a row key, or a recipe name for that recipe's rows); fair-esm's
    loop always runs: every ratio and error is read against it."""
    return not args.rows or key == "fair" or key in args.rows or key.split(":")[-1] in args.rows


def made_artifacts(args, model: prepare.BenchModel, scratch: Path, env: Mapping[str, str]) -> tuple:
    """The selected rows' artifacts, quantized as typed, and the recommended one's ONNX export: ({(source,
    recipe): folder}, {(source, recipe): quantize run}, the ONNX file or why there is none)."""
    recipes = [r for r in args.recipes if selected(args, f"art:ckpt:{r}") or
               (r == args.recommended and selected(args, "ort"))]
    arts, quant = prepare.artifacts({"ckpt": model.checkpoint}, recipes, scratch, env)
    if selected(args, f"art:hf:{args.recommended}"):
        hf_arts, hf_quant = prepare.artifacts({"hf": model.hf_folder}, [args.recommended], scratch, env)
        arts.update(hf_arts)
        quant.update(hf_quant)
    for (source, recipe), done in quant.items():
        if done.returncode:
            print(f"quantize {recipe} ({source}) failed: {done.failure()}")
    onnx = f"absent: the {args.recommended} artifact was not made"
    if ("ckpt", args.recommended) in arts and selected(args, "ort"):
        path = scratch / "onnx" / "model.onnx"
        done = prepare.export_onnx(arts["ckpt", args.recommended], path, env, log=scratch / "export.log")
        onnx = path if done.returncode == 0 else f"absent: ptq-protein export failed: {done.failure()}"
    return arts, quant, onnx


def run_config(args, model: prepare.BenchModel, fasta: Path, calib: Path, residues: int, isa: str, threads: int,
               scratch: Path) -> dict:
    """One (ISA, threads) configuration: artifacts, every row, the tables and goals printed."""
    env = child_env(threads, isa, {"TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
                                         "PTQ_PROTEIN_CACHE": str(scratch / "ptq-cache")})
    print(f"\n## {model.weights}, {threads} thread(s), {isa_label(isa)}\n\n{child_cpu_facts(env)}\n", flush=True)
    arts, quant, onnx = made_artifacts(args, model, scratch, env)
    irs, ov_runs = prepare.openvino_irs(model.hf_folder, calib, [k for k in prepare.OV_ROWS if selected(args, k)],
                                        scratch, env, args.ov_calib_seqs, args.ov_alpha)
    rows = [r for r in embed_rows(model, fasta, calib, arts, onnx, isa, args) if selected(args, r.key)]
    results = run_rows(rows + openvino_rows(model, fasta, irs, args), args.reps, scratch, env, warmup=not args.quick)
    errors = embed_errors.row_errors(results)
    means = {k: e.mean if e else None for k, e in errors.items()}
    ip = None if args.no_inprocess else run_child(
        "embed", ["--checkpoint", str(model.checkpoint), "--hf", str(model.hf_folder), "--fasta", str(fasta),
                  *artifact_args(arts), *([] if bf16_absent(isa) else ["--bf16"])], args.inprocess_reps, env, scratch)
    token_errors = (ip or {}).get("errors", {})
    quantize_s = {f"art:{s}:{r}": m.wall_s for (s, r), m in quant.items() if m.returncode == 0}
    quantize_s.update(_openvino_seconds(irs, ov_runs))
    rounds = "one run each (cold)" if args.quick else f"median of {args.reps} interleaved runs after a warm-up run"
    print(f"Whole processes, {rounds}; first run: the warm-up (inductor's cache empty); errors against fair-esm's "
          f"loop FP32\n\n{embed_table.process_table(results, residues, errors, token_errors, quantize_s)}\n")
    print("\n".join(embed_table.goals(results, args.recommended, means, token_errors, isa == "avx2")))
    print("\n".join(embed_table.openvino_points(results, errors)))
    print(embed_table.error_line(model.weights, results, errors))
    if ip and "seconds" in ip:
        print(f"\nIn-process rows (models loaded once; median of {args.inprocess_reps} after a warm-up)\n\n"
              f"{embed_table.inprocess_table(ip)}")
    elif ip:
        print(f"\nin-process rows failed: {ip['failure']}")
    return {"isa": isa, "threads": threads, "weights": model.weights, "inprocess": ip,
            "errors": means, "standardized_errors": {k: e.standardized if e else None for k, e in errors.items()},
            "quantize": {**{f"{s}:{r}": _record(m) for (s, r), m in quant.items()},
                         **{f"openvino:{step}": _record(m) for step, m in ov_runs.items()}},
            "rows": {k: {"label": r.row.label, "kind": r.row.kind, "status": r.status(),
                         "runs": list(map(_record, r.runs)), "first": _record(r.first) if r.first else None}
                     for k, r in results.items()}}


def _openvino_seconds(irs: Mapping[str, Union[Path, str]], runs: Mapping[str, object]) -> Dict[str, float]:
    """The "quantize s" of each OpenVINO row whose IR was made: the conversion, plus NNCF for the INT8 row."""
    steps = {key: ["convert", "nncf"] if prepare.OV_ROWS[key] == "int8" else ["convert"] for key in irs}
    return {key: sum(runs[s].wall_s for s in names) for key, names in steps.items() if not isinstance(irs[key], str)}


def _record(m) -> dict:
    """A :class:`bench.common.Measured` as JSON (its log left out)."""
    return {k: v for k, v in dataclasses.asdict(m).items() if k != "log"}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny model, 8 sequences of 60 residues, one cold run each "
                   "(a smoke test: torchao's compiled row only with --rows pt2e)")
    p.add_argument("--size", choices=["35m", "150m"], default="35m", help="model size (default 35m)")
    p.add_argument("--weights", nargs="+", choices=prepare.WEIGHTS, default=["outliers"],
                   help="outlier shapes of the random model (models.outlier_shapes): outliers (residual channels), "
                        "plain, ln-gain, sink, mix; several run one after another (default outliers)")
    p.add_argument("--threads", type=int, nargs="+", default=[1], help="children's thread counts (default 1)")
    p.add_argument("--isa", nargs="+", choices=ISAS, default=["native"],
                   help="native, and/or avx2: oneDNN, ATen and MKL held to AVX2 in every child (an emulation)")
    p.add_argument("--seqs", type=int, default=None, help=f"bundled sequences (default {ISSUE_SEQS})")
    p.add_argument("--reps", type=int, default=None, help="timed runs per row after the warm-up (default 3)")
    p.add_argument("--recipes", nargs="+", default=None,
                   help=f"presets quantized and embedded (default {' '.join(prepare.RECIPES)}; --quick: the first); "
                   "PRESET@A quantizes with --smoothquant-alpha A (a number or auto)")
    p.add_argument("--recommended", default=prepare.RECOMMENDED, help="the recipe of the ONNX, HF-folder and goal rows")
    p.add_argument("--rows", nargs="+", default=[], help="only these row keys (hf32 hf16 dyn ort pt2e ov32 ov ov8 fp "
                   "fp-bf16 hf-fp, a recipe name) besides fair-esm's loop, which always runs: default every row")
    p.add_argument("--ov-calib-seqs", type=int, default=8, help="NNCF's calibration sequences for the OpenVINO INT8 "
                   "row (the first of the calibration set, one per item; default 8, as issue 53's user)")
    p.add_argument("--ov-alpha", type=float, default=0.5, help="NNCF SmoothQuant alpha on MatMuls (default 0.5, as "
                   "issue 53's user; NNCF's own default is 0.95)")
    p.add_argument("--no-inprocess", action="store_true", help="skip the in-process rows")
    p.add_argument("--inprocess-reps", type=int, default=1, help="timed passes of the in-process rows after their "
                   "warm-up (default 1: no interpreter start or load to vary)")
    p.add_argument("--torchao-python", default=sys.executable,
                   help="interpreter of the torchao row (default this one); installed here, torchao is imported by "
                        "every process that imports transformers, so keep it in its own environment")
    p.add_argument("--dir", type=Path, default=prepare.DEFAULT_DIR, help="where the random checkpoints are kept")
    p.add_argument("--fresh-model", action="store_true", help="rewrite the random checkpoints first")
    p.add_argument("--json", type=Path, help="also write every measurement here")
    p.add_argument("--memory", action="store_true", help="also peak RSS of 650M-sized embedding (embed_memory)")
    args = p.parse_args(argv)
    args.seqs = args.seqs or (QUICK_SEQS if args.quick else ISSUE_SEQS)
    args.reps = args.reps or (1 if args.quick else 3)
    args.recipes = args.recipes or list(prepare.RECIPES[:1] if args.quick else prepare.RECIPES)
    if args.seqs < 1 or args.reps < 1 or args.inprocess_reps < 1 or min(args.threads) < 1 or args.ov_calib_seqs < 1:
        p.error("--seqs, --reps, --inprocess-reps, --threads and --ov-calib-seqs must be positive")
    if args.recommended not in args.recipes:
        p.error(f"--recommended {args.recommended} must be one of --recipes ({' '.join(args.recipes)})")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    size = "quick" if args.quick else args.size
    records = bundled_records(args.seqs)
    if args.quick:
        records = [(label, seq[:QUICK_LENGTH]) for label, seq in records]
    residues = sum(len(s) for _, s in records)
    print(f"# embed, whole processes\n\n`{bench_command('embed', argv)}`\n\n{len(records)} bundled sequences, "
          f"{residues} residues, 4096 tokens per batch, mean of the last layer saved per sequence\n\n{versions()}; "
          f"torchao row: {args.torchao_python}")
    if importlib.util.find_spec("torchao"):
        print("\nNote: torchao is installed for this interpreter, and transformers imports it in every process that "
              "imports transformers (the HF anchors and HF-folder rows pay that import); --torchao-python runs the "
              "torchao row from another environment instead")
    measured = []
    for weights in args.weights:
        model = prepare.bench_model(args.dir, size, weights, args.fresh_model)
        print(f"\nModel: {model.describe()}; HF folder checked equal to the checkpoint (last layer within "
              f"{prepare.HF_MATCH:g})")
        with tempfile.TemporaryDirectory(prefix="bench_embed_") as tmp:
            scratch = Path(tmp)
            fasta = write_fasta(scratch / "bench.fasta", records)
            calib = prepare.calibration_fasta(scratch / "calib.fasta")
            for isa in args.isa:
                for threads in args.threads:
                    config = scratch / f"{isa}-{threads}"
                    config.mkdir()
                    measured.append(run_config(args, model, fasta, calib, residues, isa, threads, config))
                    shutil.rmtree(config, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(measured, indent=1))
    if args.memory:
        from bench.embed_memory import memory_table

        print("\n".join(memory_table()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
