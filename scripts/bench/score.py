"""``ptq-protein score`` (masked-marginals) as users type it, whole processes, against fair-esm's predict.py loop.

One protein (the first bundled sequence of at least 300 residues, cropped to 300) and a DMS file listing every
single mutant (19 per position, numbered from 1). Rows, each a whole process (model load included) that reads
that DMS and writes the same CSV (its rows plus one score column):

* anchor: fair-esm's ``examples/variant-prediction/predict.py`` (``loops/predict.py``), masked-marginals: one
  forward per masked position, batch 1, FP32;
* as typed: ``ptq-protein score CKPT --sequence SEQ --dms DMS --strategy masked-marginals --out CSV``, and the
  same on each recipe's artifact (``ptq-protein quantize CKPT --preset R --out ART``, timed in its own column).
  Without ``--dms`` the command scores the same single mutants and also draws a heatmap (PNG, PDF, SVG): the
  DMS keeps the output work equal to predict.py's.

Timing as in ``embed.py`` (warm-up run, then the median of ``--reps`` interleaved runs; ``os.wait4`` rusage).
Each artifact's drift is the Spearman rho of its scores against the FP command's over all single mutants; the
FP command against predict.py is the check that both compute the same scores. In-process rows
(``inprocess.py score``): predict.py's loop and the library's batched masked copies, models loaded once.
Random weights: a toolkit check, never biology.

    python -m scripts.bench score --quick
    python -m scripts.bench score --size 35m --threads 1 2 --isa native avx2 --reps 3
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from bench import prepare
from bench.common import (
    ISAS,
    bench_command,
    bundled_records,
    child_cpu_facts,
    child_env,
    isa_label,
    judge,
    markdown_table,
    versions,
)
from bench.inprocess import artifact_args, run_child
from bench.process_rows import OUT, Row, RowResult, run_rows

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
LENGTH, QUICK_LENGTH = 300, 40
GOAL_SPEED, GOAL_DRIFT = 2.0, 0.99
PREDICT = "predict"


def protein(length: int) -> str:
    """The first bundled sequence with at least ``length`` residues, its first ``length``."""
    return next(seq for _, seq in bundled_records(10 ** 6) if len(seq) >= length)[:length]


def singles_csv(path: Path, sequence: str) -> Path:
    """A DMS file with every single substitution (``A24G``, numbered from 1) in a ``mutant`` column."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["mutant"])
        writer.writerows([f"{wt}{i + 1}{aa}"] for i, wt in enumerate(sequence) for aa in AMINO_ACIDS if aa != wt)
    return path


def read_scores(folder: Path) -> Dict[str, float]:
    """{mutant: score} of the CSV a row wrote (the last column is the score)."""
    with open(folder / "scores.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    column = rows[0].index("mutant")
    return {row[column]: float(row[-1]) for row in rows[1:]}


def score_rows(model: prepare.BenchModel, sequence: str, dms: Path, arts: Mapping, recipes: Sequence[str]) -> List[Row]:
    cli, csv_out = prepare.cli(), f"{OUT}/scores.csv"
    common = ("--sequence", sequence, "--dms", str(dms), "--strategy", "masked-marginals", "--out", csv_out)
    rows = [Row(PREDICT, "fair-esm predict.py, masked-marginals, FP32", "anchor",
                (sys.executable, prepare.loop_script("predict"), "--model-location", str(model.checkpoint),
                 "--sequence", sequence, "--dms-input", str(dms), "--dms-output", csv_out, "--offset-idx", "1",
                 "--scoring-strategy", "masked-marginals", "--nogpu")),
            Row("fp", "ptq-protein score CKPT", "as typed", (*cli, "score", str(model.checkpoint), *common))]
    for recipe in recipes:
        art = arts.get(("ckpt", recipe))
        rows.append(Row(f"art:ckpt:{recipe}", f"ptq-protein score ART ({recipe})", "as typed",
                        (*cli, "score", str(art), *common), absent="" if art else "absent: quantize failed"))
    return rows


def drift(results: Mapping[str, RowResult]) -> Dict[str, Dict[str, float]]:
    """{row: {"spearman", "max_abs"}} of each row's scores against the FP command's (same mutants)."""
    from ptq_protein.eval.rank_correlation import spearman

    if "fp" not in results or not results["fp"].ok:
        return {}
    fp = read_scores(results["fp"].out)
    found = {}
    for key, r in results.items():
        if key != "fp" and r.ok:
            have = read_scores(r.out)
            if set(have) == set(fp):
                a, b = [fp[m] for m in fp], [have[m] for m in fp]
                found[key] = {"spearman": spearman(a, b), "max_abs": max(abs(x - y) for x, y in zip(a, b))}
    return found


def score_table(results: Mapping[str, RowResult], drifts: Mapping[str, Mapping[str, float]],
                quantize_s: Mapping[str, float]) -> str:
    anchor = results.get(PREDICT)
    rows = []
    for key, r in results.items():
        if not r.ok:
            rows.append([r.row.label, r.row.kind, r.status()] + [""] * 9)
            continue
        wall = r.median("wall_s")
        ratio = f"{anchor.median('wall_s') / wall:.2f}x" if anchor is not None and anchor.ok else ""
        d = drifts.get(key, {})
        rows.append([r.row.label, r.row.kind, f"{wall:.1f}", f"{r.first.wall_s:.1f}" if r.first else "", ratio,
                     f"{r.median('user_s'):.1f}", f"{100 * r.median('kernel_share'):.1f}%",
                     f"{r.median('minor_faults'):.0f}", f"{r.peak_rss_gib:.2f}",
                     f"{d['spearman']:.4f}" if d else "", f"{d['max_abs']:.2g}" if d else "",
                     f"{quantize_s[key]:.1f}" if key in quantize_s else ""])
    return markdown_table(["row", "kind", "wall s", "first run s", "vs predict.py", "user s", "kernel share",
                           "minor faults", "peak RSS GiB", "Spearman vs FP command", "max |score - FP|",
                           "quantize s"], rows)


def goal_lines(results: Mapping[str, RowResult], drifts: Mapping[str, Mapping[str, float]]) -> List[str]:
    anchor = results.get(PREDICT)
    lines = []
    for key, r in results.items():
        if r.row.kind == "as typed" and r.ok and anchor is not None and anchor.ok:
            speed = anchor.median("wall_s") / r.median("wall_s")
            line = f"- {r.row.label}: " + judge("vs predict.py", speed, GOAL_SPEED)
            if key in drifts and key != PREDICT:
                line += "; " + judge("drift Spearman", drifts[key]["spearman"], GOAL_DRIFT, unit="")
            lines.append(line)
    return lines


def inprocess_table(data: Mapping[str, object]) -> str:
    seconds: Mapping[str, float] = data["seconds"]
    loop = next((s for name, s in seconds.items() if name.startswith("predict.py")), None)
    rows = [[f"{name} [in-process]", f"{s:.2f}", f"{loop / s:.2f}x" if loop else ""] for name, s in seconds.items()]
    return markdown_table(["row", "seconds (median)", "vs predict.py loop (in-process)"], rows)


def run_config(args, model: prepare.BenchModel, sequence: str, dms: Path, isa: str, threads: int,
               scratch: Path) -> None:
    env = child_env(threads, isa, {"TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor")})
    print(f"\n## {model.weights}, {threads} thread(s), {isa_label(isa)}\n\n{child_cpu_facts(env)}\n", flush=True)
    arts, quant = prepare.artifacts({"ckpt": model.checkpoint}, args.recipes, scratch, env)
    for (_, recipe), done in quant.items():
        if done.returncode:
            print(f"quantize {recipe} failed: {done.failure()}")
    results = run_rows(score_rows(model, sequence, dms, arts, args.recipes), args.reps, scratch, env,
                       warmup=not args.quick)
    drifts = drift(results)
    quantize_s = {f"art:{s}:{r}": m.wall_s for (s, r), m in quant.items() if m.returncode == 0}
    rounds = "one run each (cold)" if args.quick else f"median of {args.reps} interleaved runs after a warm-up run"
    print(f"Whole processes, {rounds}\n\n{score_table(results, drifts, quantize_s)}\n")
    print("\n".join(goal_lines(results, drifts)))
    if not args.no_inprocess:
        ip = run_child("score", ["--checkpoint", str(model.checkpoint), "--sequence", sequence,
                                 *artifact_args(arts)], args.inprocess_reps, env, scratch)
        print(f"\nIn-process rows (models loaded once; median of {args.inprocess_reps} after a warm-up)\n\n"
              f"{inprocess_table(ip)}" if "seconds" in ip else f"\nin-process rows failed: {ip['failure']}")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny model, a 40-residue protein, one cold run each")
    p.add_argument("--size", choices=["35m", "150m"], default="35m", help="model size (default 35m)")
    p.add_argument("--weights", nargs="+", choices=prepare.WEIGHTS, default=["outliers"])
    p.add_argument("--threads", type=int, nargs="+", default=[1], help="children's thread counts (default 1)")
    p.add_argument("--isa", nargs="+", choices=ISAS, default=["native"], help="native, and/or avx2 (an emulation)")
    p.add_argument("--length", type=int, default=None, help=f"residues of the protein (default {LENGTH})")
    p.add_argument("--reps", type=int, default=None, help="timed runs per row after the warm-up (default 3)")
    p.add_argument("--recipes", nargs="+", default=None,
                   help=f"presets quantized and scored (default {prepare.RECOMMENDED} w8a8-pwlq; --quick: the first)")
    p.add_argument("--no-inprocess", action="store_true", help="skip the in-process rows")
    p.add_argument("--inprocess-reps", type=int, default=1, help="timed passes of the in-process rows after their "
                   "warm-up (default 1: no interpreter start or load to vary)")
    p.add_argument("--dir", type=Path, default=prepare.DEFAULT_DIR, help="where the random checkpoints are kept")
    p.add_argument("--fresh-model", action="store_true", help="rewrite the random checkpoints first")
    args = p.parse_args(argv)
    args.length = args.length or (QUICK_LENGTH if args.quick else LENGTH)
    args.reps = args.reps or (1 if args.quick else 3)
    args.recipes = args.recipes or [prepare.RECOMMENDED] + ([] if args.quick else ["w8a8-pwlq"])
    if args.reps < 1 or args.inprocess_reps < 1 or min(args.threads) < 1 or not 1 <= args.length <= 1022:
        p.error("--reps, --inprocess-reps and --threads must be positive, --length in 1..1022")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    sequence = protein(args.length)
    print(f"# score (masked-marginals), whole processes\n\n`{bench_command('score', argv)}`\n\n"
          f"one {len(sequence)}-residue protein, {19 * len(sequence)} single mutants; predict.py runs "
          f"{len(sequence) + 2} forwards of batch 1 (every token position masked once, BOS and EOS included)\n\n"
          f"{versions()}")
    for weights in args.weights:
        model = prepare.bench_model(args.dir, "quick" if args.quick else args.size, weights, args.fresh_model)
        print(f"\nModel: {model.describe()}")
        with tempfile.TemporaryDirectory(prefix="bench_score_") as tmp:
            scratch = Path(tmp)
            dms = singles_csv(scratch / "singles.csv", sequence)
            for isa in args.isa:
                for threads in args.threads:
                    config = scratch / f"{isa}-{threads}"
                    config.mkdir()
                    run_config(args, model, sequence, dms, isa, threads, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
