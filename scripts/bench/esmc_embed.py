#!/usr/bin/env python
"""ESM C embedding throughput: ``ptq-protein embed`` against EvolutionaryScale's own FP32 loop, in one run.

Workload: the first ``--seqs`` bundled sequences (default 100, 26,811 residues; as ``embed.py``), mean of
the last layer kept. Model: a seeded
random ESM C with planted outlier channels (random weights: a toolkit measurement, not biology), 600M-sized
(36 x 1152, 18 heads) by default, written once as an official-layout ``.pth`` that both sides load. Rows, each
over the whole workload at each thread count (best of ``--reps``; the model load is not timed):

* the official package's loop, FP32 (``scripts/esmc_official_loop.py`` in the official venv, one protein at a
  time through ``ESMC.encode`` / ``ESMC.logits``, as its documentation shows) [anchor], and where the CPU has bf16
  (avx512_bf16 or amx_bf16) the same loop with the model cast to bfloat16 [anchor];
* ``embed`` (the CLI's run) with the FP32 model, and with each 8-bit artifact (``backend="int8"``); as typed, also
  ``embed`` of the ``.pth`` with ``--dtype bfloat16`` where the CPU has bf16.

Also per artifact: the last layer's per-residue error against FP, and (a correctness check, not a timing) the
largest difference between the official loop's mean embeddings and ptq-protein's FP ones. ``--memory`` adds the
peak RSS of loading the ``.pth`` in a fresh process against the file's size (goal < 1.2x).

The official venv (``--official-python``, default /work/venv-esmc/bin/python) is the one
``scripts/esmc_reference.py`` documents; without it the anchor row is skipped with a line saying so.

    python -m scripts.bench esmc_embed --quick         # tiny model, 12 short sequences: a smoke test
    python -m scripts.bench esmc_embed --threads 1     # the goal's setting (600M-sized, one thread)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

HERE = Path(__file__).resolve().parents[1]  # scripts/
sys.path.insert(0, str(HERE))
from bench.common import best_rates as time_rows  # noqa: E402
from bench.common import (  # noqa: E402
    bundled_records,
    child_env,
    command_line,
    cpu_facts,
    environment_line,
    markdown_table,
    run_measured,
    run_timed,
)
from bench.inprocess import TOKS, embed_run  # noqa: E402
from bench.inprocess import per_token_error as last_layer_error  # noqa: E402
from bench.prepare import cli  # noqa: E402

SIZES = {"600m": (36, 1152, 18), "300m": (30, 960, 15), "quick": (2, 64, 4)}  # layers, width, heads
PRESETS = ("w8a8-uniform", "w8a8-smoothquant", "w8a8-pwlq", "w8a8-dynamic")  # bench_embed's three, and dynamic
GOAL_VS_OFFICIAL, GOAL_VS_BF16, GOAL_ERROR, GOAL_LOAD_RSS = 2.5, 1.3, 0.02, 1.2  # ESM-2's embed goals (as typed)
OFFICIAL = "EvolutionaryScale ESMC loop (encode + logits, one protein at a time), FP32 [anchor]"
OFFICIAL_BF16 = "the same loop, model cast to bfloat16 [anchor]"
DEFAULT_PYTHON = os.environ.get("ESMC_OFFICIAL_PYTHON", "/work/venv-esmc/bin/python")


def write_model(size: str, folder: Path):
    """The seeded ESM C (planted outliers) and its official-layout ``.pth`` in ``folder``."""
    from ptq_protein.models.tiny import tiny_esmc

    layers, width, heads = SIZES[size]
    model = tiny_esmc(0, num_layers=layers, d_model=width, heads=heads)[0]
    path = folder / f"esmc_random_{size}.pth"
    torch.save(model.state_dict(), path)
    return model, path


def has_bf16() -> bool:
    """Whether the CPU lists bf16 instructions (the bf16 anchors run only there, as in ``bench embed``)."""
    from bench.embed import bf16_absent

    return not bf16_absent("native")


def official_row(python: str, path: Path, fasta: Path, size: str, threads: int, reps: int, folder: Path,
                 dtype: str = "float32") -> Tuple[Optional[float], Dict[str, torch.Tensor], str]:
    """(residues/s or None, mean embeddings by label, why skipped) of the official loop in its own venv."""
    if not Path(python).is_file():
        return None, {}, (f"official loop skipped: no {python} (create the venv as scripts/esmc_reference.py says, "
                          "or pass --official-python)")
    layers, width, heads = SIZES[size]
    means = folder / f"official-{threads}-{dtype}.safetensors"
    command = [python, str(HERE / "esmc_official_loop.py"), "--weights", str(path), "--fasta", str(fasta),
               "--means", str(means), "--d-model", str(width), "--heads", str(heads), "--layers", str(layers),
               "--threads", str(threads), "--reps", str(reps), "--dtype", dtype]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    if done.returncode != 0:
        return None, {}, f"official loop failed: {done.stderr.strip().splitlines()[-1:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    from safetensors.torch import load_file

    return result["residues"] / result["seconds"], load_file(str(means)), ""


def fp_means(model, records) -> Dict[str, torch.Tensor]:
    from ptq_protein.models.lm_outputs import lm_forward, lm_info, lm_tokens

    n = lm_info(model).last_layer  # the final LayerNorm's output, as embed --repr-layers -1
    return {label: lm_forward(model, lm_tokens([seq]), [n]).representations[n][0, 1:-1].mean(0)
            for label, seq in records}


def load_rss_line(path: Path) -> str:
    """Peak RSS of ``load_model(path)`` in a fresh process, against the file's size. The process is started by
    ``run_measured``'s small launcher: a child forked from this (large) process would report at least its peak."""
    code = "import sys; from ptq_protein.models.loading import load_model; load_model(sys.argv[1])"
    peak = run_timed([sys.executable, "-c", code, str(path)])["rss_gib"] * 2 ** 30
    ratio = peak / path.stat().st_size
    return (f"\nload_model of the {path.stat().st_size / 2 ** 30:.2f} GiB .pth in a fresh process: peak RSS "
            f"{peak / 2 ** 30:.2f} GiB = {ratio:.2f}x the file (goal < {GOAL_LOAD_RSS}x: "
            f"{'met' if ratio < GOAL_LOAD_RSS else 'missed'})")


def build_rows(model, path: Path, records, scratch: Path, presets: Sequence[str], calib: Sequence[str]):
    """{row: callable returning residues}, {row: last-layer error} for our rows (FP32 and each artifact)."""
    import ptq_protein as pp
    from ptq_protein.models.loading import load_model

    rows = {"embed, FP32": embed_run(load_model(path).model, records, scratch, "fp32")}
    errors: Dict[str, float] = {}
    arts: Dict[str, Path] = {}
    for preset in presets:
        art = arts[preset] = scratch / f"art-{preset}"
        pp.save(pp.quantize(model, preset, calibration=list(calib)), art)
        qmodel = pp.load(art)  # the backend it picks here, as the command's
        error = last_layer_error(model, qmodel, records[:8])  # its forwards choose the engine
        backend = qmodel.ptq_state.config.backend.value
        label = f"embed, {preset} artifact, {backend} ({pp.engine_used(qmodel) or 'fake'})"
        errors[label], rows[label] = error, embed_run(qmodel, records, scratch, preset)
    return rows, errors, arts


def typed_rows(path: Path, arts: Dict[str, Path], fasta: Path, residues: int, official: Optional[float],
               bf16: Optional[float], threads: int, scratch: Path) -> List[str]:
    """``ptq-protein embed MODEL FASTA --out DIR`` as typed (default options), each a whole process, model load
    included; the official loops' rates are their loops alone (their load is not counted: a bound in their
    favour). Each artifact's speed is judged against ESM-2's goals: >= 2.5x the FP32 loop, >= 1.3x the BF16 one."""
    runs = [("FP32 .pth", path, ()), *((("FP .pth --dtype bfloat16", path, ("--dtype", "bfloat16")),)
                                       if has_bf16() else ()), *((f"{p} artifact", a, ()) for p, a in arts.items())]
    rows, verdicts = [], []
    for i, (name, model, extra) in enumerate(runs):
        out = scratch / f"typed-{threads}-{i}"
        done = run_measured([*cli(), "embed", str(model), str(fasta), "--out", str(out), *extra],
                            child_env(threads, "native"))
        shutil.rmtree(out, ignore_errors=True)
        rate = residues / done.wall_s if done.returncode == 0 else None
        rows.append([f"ptq-protein embed {name}", f"{done.wall_s:.1f}", f"{rate:.0f}" if rate else done.failure(),
                     f"{rate / official:.2f}x" if rate and official else "",
                     f"{rate / bf16:.2f}x" if rate and bf16 else "", f"{100 * done.kernel_share:.1f}%",
                     f"{done.rss_gib:.2f}"])
        if rate and name.endswith("artifact"):
            verdicts.append(_verdict(name, rate, official, GOAL_VS_OFFICIAL, "the FP32 loop"))
            verdicts.append(_verdict(name, rate, bf16, GOAL_VS_BF16, "the BF16 loop"))
    return [f"\nAs typed, {threads} thread(s): whole processes, model load included\n",
            markdown_table(["command", "wall s", "residues/s", "vs official loop", "vs official BF16", "kernel share",
                            "peak RSS GiB"], rows), "", *filter(None, verdicts)]


def _verdict(name: str, rate: float, anchor: Optional[float], goal: float, what: str) -> str:
    if not anchor:
        return ""
    return (f"{name} as typed: {rate / anchor:.2f}x {what} (goal >= {goal}x: "
            f"{'met' if rate / anchor >= goal else 'missed'})")


def report(timed: Dict[str, Tuple[float, float]], official: Optional[float], bf16: Optional[float],
           errors: Dict[str, float], threads: int) -> List[str]:
    rows = [[name, f"{rate:.0f}", f"{rate / official:.2f}x" if official else "",
             f"{100 * errors[name]:.2f}%" if name in errors else ""] for name, (rate, _) in timed.items()]
    if bf16:
        rows.insert(0, [OFFICIAL_BF16, f"{bf16:.0f}", f"{bf16 / official:.2f}x" if official else "", ""])
    if official:
        rows.insert(0, [OFFICIAL, f"{official:.0f}", "1.00x", ""])
    lines = [f"\n### {threads} thread(s)\n", markdown_table(["row", "residues/s", "vs official loop",
                                                            "last-layer error"], rows)]
    eligible = {n: timed[n][0] for n in errors if errors[n] <= GOAL_ERROR}
    if official and eligible:
        name = max(eligible, key=eligible.get)
        speed = eligible[name] / official
        lines.append(f"\nfastest 8-bit row with last-layer error <= {100 * GOAL_ERROR:.0f}%: {name}: {speed:.2f}x the "
                     f"official loop (goal >= {GOAL_VS_OFFICIAL}x: {'met' if speed >= GOAL_VS_OFFICIAL else 'missed'})")
    return lines


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny model and 12 short sequences (smoke test)")
    p.add_argument("--size", choices=["600m", "300m"], default="600m")
    p.add_argument("--seqs", type=_positive, default=100, help="bundled sequences to embed (default the first 100)")
    p.add_argument("--threads", type=_positive, nargs="+", default=[1, 2], help="thread counts (default 1 2)")
    p.add_argument("--reps", type=_positive, default=1, help="passes per row, best kept (default 1)")
    p.add_argument("--presets", nargs="+", default=list(PRESETS), help="8-bit recipes (int8 artifacts)")
    p.add_argument("--official-python", default=DEFAULT_PYTHON, help=f"the official venv's python ({DEFAULT_PYTHON})")
    p.add_argument("--memory", action="store_true", help="also peak RSS of loading the .pth in a fresh process")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    size = "quick" if args.quick else args.size
    records = bundled_records(12 if args.quick else args.seqs)
    records = [(label, seq[:60]) for label, seq in records] if args.quick else records
    layers, width, heads = SIZES[size]
    print(f"# bench_esmc_embed\n\n`{command_line(argv if argv is not None else sys.argv[1:], __file__)}`\n\n"
          f"{cpu_facts()}\n\n{environment_line(args.threads[0])}; model: seeded random ESM C {layers} x {width}, "
          f"{heads} heads, planted outlier channels (random weights: a toolkit measurement, not biology); "
          f"{len(records)} bundled sequences, {sum(len(s) for _, s in records)} residues, {TOKS} tokens per batch, "
          "mean of the last layer kept")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        fasta = scratch / "bench.fasta"
        fasta.write_text("".join(f">{label}\n{seq}\n" for label, seq in records))
        model, path = write_model(size, scratch)
        calib = [seq[:256] for _, seq in records[::max(1, len(records) // 16)]][:16]
        rows, errors, arts = build_rows(model, path, records, scratch, args.presets, calib)
        residues = sum(len(s) for _, s in records)
        for threads in args.threads:
            official, means, why = official_row(args.official_python, path, fasta, size, threads, args.reps, scratch)
            bf16 = None
            if has_bf16() and official:
                bf16 = official_row(args.official_python, path, fasta, size, threads, args.reps, scratch,
                                    "bfloat16")[0]
            print("\n".join(report(time_rows(rows, threads, args.reps), official, bf16, errors, threads)))
            print("\n".join(typed_rows(path, arts, fasta, residues, official, bf16, threads, scratch)))
            if why:
                print(f"\n{why}")
            elif threads == args.threads[0]:
                ours = fp_means(model, records)
                gap = max(float((ours[k] - v).abs().max()) for k, v in means.items())
                print(f"\nmean embeddings, ptq-protein FP32 vs the official loop: largest difference {gap:.2e}")
        if args.memory:
            print(load_rss_line(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
