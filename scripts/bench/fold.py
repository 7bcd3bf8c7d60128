#!/usr/bin/env python
"""ESMFold as typed: ``ptq-protein quantize`` with defaults, then ``fold`` of the artifact, against transformers' loops.

Model: a seeded random ESMFold at the v1 trunk's widths (c_s 1024, c_z 128, the published structure module) with
``--blocks`` folding blocks on an ESM-2 stem of ``--stem``'s shape, ``--outliers`` planting outlier channels in
the stem; written once as fair-esm's file and as a transformers folder (the same weights). Random weights: a
toolkit measurement, never biology.

Workload: ``--targets`` cameo139 targets of ``--lengths`` residues (evenly spread over that range). Rows, each a
whole process, one thread by default, run once untimed and then ``--reps`` interleaved rounds (CPU seconds =
user + sys of the child, the median; peak RSS from the child's own accounting):

* transformers ``EsmForProteinFolding``, one ``infer_pdb`` per sequence, FP32 [anchor, the reference fold];
* the same loop with ``model.esm`` cast to bfloat16 [anchor, the perturbation control];
* ``ptq-protein fold CKPT --fasta`` (the FP file) [as typed];
* ``ptq-protein fold ART --fasta`` of ``ptq-protein quantize CKPT --bits 8`` (its defaults) [as typed].

Each row's TM-score to the FP32 loop's fold, per target (``ptq_protein.eval.tmscore``, equal to TMscore's), and
the quantize command's own wall, CPU seconds and peak.

    python -m scripts.bench fold --quick                       # 1 block, 2 short targets: a smoke run
    python -m scripts.bench fold --blocks 8 --targets 10       # the fidelity set
    python -m scripts.bench fold --blocks 48 --targets 5 --reps 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parents[1]  # scripts/
sys.path.insert(0, str(HERE))
from bench.common import child_env, command_line, cpu_facts, markdown_table, run_measured, versions  # noqa: E402
from bench.process_rows import OUT, Row, run_rows  # noqa: E402

LOOP = str(HERE / "bench" / "loops" / "fold_loop.py")
CLI = [sys.executable, "-m", "ptq_protein.cli.main"]


def targets(count: int, lo: int, hi: int) -> List[Tuple[str, str]]:
    """``count`` cameo139 targets of lo..hi residues, evenly spread over that range by length."""
    from ptq_protein.data.sets import load_set

    found = load_set("cameo139")
    pool = sorted(((i, s) for i, s in zip(found.ids, found.sequences()) if lo <= len(s) <= hi), key=lambda r: len(r[1]))
    if len(pool) < count:
        raise SystemExit(f"only {len(pool)} cameo139 targets have {lo}-{hi} residues; ask for fewer")
    step = (len(pool) - 1) / max(1, count - 1)
    return [pool[round(k * step)] for k in range(count)]


def rows_for(ckpt: Path, folder: Path, art: Path, fasta: Path) -> List[Row]:
    return [Row("hf_fp32", "transformers EsmForProteinFolding, infer_pdb per sequence, FP32", "anchor",
                (sys.executable, LOOP, str(folder), str(fasta), OUT)),
            Row("hf_bf16_stem", "the same loop, model.esm cast to bfloat16", "anchor",
                (sys.executable, LOOP, str(folder), str(fasta), OUT, "--bf16-stem")),
            Row("fold_ckpt", "ptq-protein fold CKPT --fasta (FP32)", "as typed",
                (*CLI, "fold", str(ckpt), "--fasta", str(fasta), "--out", OUT)),
            Row("fold_art", "ptq-protein fold ART --fasta (quantize --bits 8, defaults)", "as typed",
                (*CLI, "fold", str(art), "--fasta", str(fasta), "--out", OUT))]


def tm_to_reference(results, ids: Sequence[str]) -> Dict[str, List[float]]:
    """Each row's TM-score per target to the FP32 loop's fold (normalised by the target's length)."""
    from ptq_protein.eval.tmscore import tm_score

    ref = results["hf_fp32"].out
    return {key: [tm_score(str(r.out / f"{i}.pdb"), str(ref / f"{i}.pdb")).tm_score for i in ids]
            for key, r in results.items() if r.ok and key != "hf_fp32"}


def report(results, tms: Dict[str, List[float]], quantize: dict) -> str:
    fp = results["hf_fp32"]
    cpu = {k: r.median("user_s") + r.median("sys_s") for k, r in results.items() if r.ok}
    lines = [markdown_table(
        ["row", "kind", "CPU s", "vs FP32 loop", "vs bf16-stem loop", "peak RSS GiB", "vs FP32 peak",
         "TM to FP32 fold (min / mean)"],
        [[r.row.label, r.row.kind, f"{cpu[k]:.1f}", f"{cpu[k] / cpu['hf_fp32']:.2f}x",
          f"{cpu[k] / cpu['hf_bf16_stem']:.2f}x", f"{r.peak_rss_gib:.2f}", f"{r.peak_rss_gib / fp.peak_rss_gib:.2f}x",
          "reference" if k == "hf_fp32" else f"{min(tms[k]):.3f} / {sum(tms[k]) / len(tms[k]):.3f}"]
         if r.ok else [r.row.label, r.row.kind, r.status(), "", "", "", "", ""]
         for k, r in results.items()])]
    lines.append("")
    lines.append("per target TM (bf16-stem control / artifact): " + ", ".join(
        f"{a:.3f}/{b:.3f}" for a, b in zip(tms.get("hf_bf16_stem", []), tms.get("fold_art", []))))
    lines.append(f"quantize --bits 8 (defaults), as typed: wall {quantize['wall_s']:.0f} s, CPU "
                 f"{quantize['user_s'] + quantize['sys_s']:.0f} s, peak {quantize['rss_gib']:.2f} GiB; the FP32 loop's "
                 f"wall on this workload {fp.median('wall_s'):.0f} s: {quantize['wall_s'] / fp.median('wall_s'):.1f}x")
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=8, help="folding blocks of the trunk (the published model: 48)")
    p.add_argument("--stem", default="esm2_8M", help="the ESM-2 stem's shape (esm2_8M, esm2_35M, esm2_650M, ...)")
    p.add_argument("--outliers", action="store_true", help="plant outlier channels in the stem")
    p.add_argument("--targets", type=int, default=5)
    p.add_argument("--lengths", default="60-150", help="target lengths, LO-HI residues")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                   help="skip the untimed first round (long 48-block runs: the timed round is then the cold one)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", type=Path, help="keep the model, artifact and outputs here (default: a temp folder)")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    p.add_argument("--quick", action="store_true", help="1 block, the 8M stem, 2 targets of 30-70 residues, 1 rep")
    args = p.parse_args(argv)
    if args.quick:
        args.blocks, args.stem, args.targets, args.lengths, args.reps = 1, "esm2_8M", 2, "30-70", 1
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    from make_random_checkpoints import write_esmfold

    lo, hi = (int(x) for x in args.lengths.split("-"))
    chosen = targets(args.targets, lo, hi)
    with tempfile.TemporaryDirectory(prefix="bench_fold_") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ckpt = write_esmfold(work, args.blocks, args.stem, outliers=args.outliers, hf=True)
        fasta = work / "targets.fasta"
        fasta.write_text("".join(f">{i}\n{s}\n" for i, s in chosen))
        env = child_env(args.threads, "native")
        art = work / "art"
        quantize = run_measured([*CLI, "quantize", str(ckpt), "--bits", "8", "--out", str(art), "--force"], env,
                                log=work / "quantize.log")
        if quantize.returncode != 0:
            raise SystemExit(f"quantize failed: {quantize.failure()}")
        results = run_rows(rows_for(ckpt, work / (ckpt.stem + "-hf"), art, fasta), args.reps, work / "runs", env,
                           warmup=args.warm_up)
        tms = tm_to_reference(results, [i for i, _ in chosen])
        q = {"wall_s": quantize.wall_s, "user_s": quantize.user_s, "sys_s": quantize.sys_s, "rss_gib": quantize.rss_gib}
        print(f"# fold bench: random ESMFold, {args.blocks} blocks on the {args.stem} stem"
              f"{' with planted outliers' if args.outliers else ''}; {len(chosen)} cameo139 targets "
              f"({', '.join(f'{i} {len(s)}' for i, s in chosen)}); {args.threads} thread(s), {args.reps} rep(s)"
              f"{'' if args.warm_up else ', no warm-up round'}")
        print(f"# {cpu_facts()}\n# {versions()}\n# {command_line(sys.argv[1:] if argv is None else argv, 'fold')}")
        print("# random weights: toolkit measurements, not biology")
        print(report(results, tms, q))
        if args.json:
            args.json.write_text(json.dumps({"quantize": q, "tm": tms, "rows": {
                k: {"cpu_s": r.median("user_s") + r.median("sys_s"), "wall_s": r.median("wall_s"),
                    "peak_rss_gib": r.peak_rss_gib} for k, r in results.items() if r.ok}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
