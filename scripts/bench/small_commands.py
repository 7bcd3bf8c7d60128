#!/usr/bin/env python
"""Whole-process time of the small commands against ``python -c "import numpy, Bio.PDB"``, interleaved.

Usage::

    python -m scripts.bench small_commands                      # this checkout: 5 counted rounds after 1 warm-up
    python -m scripts.bench small_commands --baseline c6ee053   # also ``tmscore`` from an older commit
    python -m scripts.bench small_commands --rounds 9 --only tmscore

Each round runs every command once, one after the other, each in a fresh
interpreter started from a scratch directory (so the checkout's folder does
not shadow what is imported). The table gives the median wall and CPU (user +
sys) seconds of the counted rounds, the range of the wall times, and the
ratio of the median wall to the import floor's (``python -c "import numpy,
Bio.PDB"``; the goal for ``tmscore`` is <= 2.5). ``--baseline COMMIT`` extracts
that commit's source with ``git archive`` into the scratch directory and runs
its ``tmscore`` too (through ``PYTHONPATH``, with the package folders linked
as ``pyproject.toml`` maps them), for a before/after pair measured side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
STRUCTURES = REPO / "tests" / "eval" / "data" / "structures"
MODEL = STRUCTURES / "noise_7TV9_3.model.pdb.gz"  # 63 residues, TM-score 0.33
NATIVE = STRUCTURES / "7TV9.native.pdb.gz"
FULL_NATIVE = STRUCTURES / "7TV9.full.pdb.gz"
LINKED = {"eval": "eval", "kernels": "kernels"}  # package-dir of ptq_protein.eval and ptq_protein.kernels


def commands(scratch: Path, baseline: bool) -> dict:
    """label -> (argv, extra environment) of every command to time."""
    cli = [sys.executable, "-m", "ptq_protein.cli.main"]
    pred = scratch / "pred.npy"
    table = {
        "floor: python -c 'import numpy, Bio.PDB'": ([sys.executable, "-c", "import numpy, Bio.PDB"], {}),
        "tmscore": (cli + ["tmscore", str(MODEL), str(NATIVE)], {}),
        "lddt": (cli + ["lddt", str(MODEL), str(NATIVE)], {}),
        "contacts": (cli + ["contacts", str(pred), str(FULL_NATIVE)], {}),
        "--help": (cli + ["--help"], {}),
        "--version": (cli + ["--version"], {}),
    }
    if baseline:
        table["tmscore (baseline)"] = (cli + ["tmscore", str(MODEL), str(NATIVE)],
                                       {"PYTHONPATH": str(scratch / "baseline")})
    return table


def run_once(argv: list, env: dict, cwd: Path) -> tuple:
    """(wall s, CPU s) of one whole process; its output is discarded."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited with {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def extract_baseline(commit: str, scratch: Path) -> None:
    """``git archive`` of ``commit`` into scratch/baseline, with the package folders linked as installed."""
    target = scratch / "baseline"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    for name, folder in LINKED.items():  # older commits kept some package folders at the top level
        link = target / "ptq_protein" / name
        if (target / folder).is_dir() and not link.exists():
            link.symlink_to(target / folder)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted (default 1)")
    parser.add_argument("--baseline", help="a git commit whose tmscore to time beside this checkout's")
    parser.add_argument("--only", nargs="*", default=[], help="labels to time besides the floor (default all)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0:
        parser.error("need --rounds >= 1 and --warmup >= 0")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        import numpy as np

        from ptq_protein.eval.contacts import contact_map
        from ptq_protein.eval.structure import load_structure

        np.save(scratch / "pred.npy", contact_map(load_structure(FULL_NATIVE)).astype(np.float32))
        if args.baseline:
            extract_baseline(args.baseline, scratch)
        table = commands(scratch, bool(args.baseline))
        if args.only:
            table = {k: v for k, v in table.items() if k.startswith("floor") or k.split(" ")[0] in args.only}
        times = {label: [] for label in table}
        for r in range(args.warmup + args.rounds):
            for label, (command, env) in table.items():
                result = run_once(command, env, scratch)
                if r >= args.warmup:
                    times[label].append(result)
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"`python -m scripts.bench small_commands {shown}`".replace(" `", "`"))
    print(f"{args.rounds} counted rounds after {args.warmup} warm-up, interleaved; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.2f} at the end\n")
    print("| command | median wall (s) | wall min-max (s) | median CPU (s) | wall / floor |")
    print("| --- | ---: | ---: | ---: | ---: |")
    floor = statistics.median(w for w, _ in next(iter(times.values())))
    for label, runs in times.items():
        walls = [w for w, _ in runs]
        wall, cpu = statistics.median(walls), statistics.median(c for _, c in runs)
        print(f"| {label} | {wall:.3f} | {min(walls):.3f}-{max(walls):.3f} | {cpu:.3f} | {wall / floor:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
