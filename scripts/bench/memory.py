"""Peak memory and wall time of ``quantize`` on real-size random-weight checkpoints (issue 13).

Toolkit check, random weights: nothing here measures biology. Each case runs in a
fresh process; its peak RSS is the child's ``ru_maxrss`` (``os.wait4``: what ``/usr/bin/time -v``
reports as "Maximum resident set size"). Make the checkpoints first (under /tmp, never committed)::

    python scripts/make_random_checkpoints.py esm2_150M esm2_650M esmfold_trunk
    python -m scripts.bench memory esm2_150M esm2_650M esmfold_trunk

Cases: ``quantize`` through the CLI (fair-esm ESM-2) or through the API with the
trunk's config (ESMFold-sized trunk, 2 sequences, 0 recycles); and, for the wall
ratio, a float baseline: load + FP forward of the same calibration set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # scripts/
sys.path.insert(0, str(HERE))
from bench.common import run_timed  # noqa: E402  (the bench package: processes measured)

FILES = {"esm2_150M": "esm2_t30_150M_UR50D.pt", "esm2_650M": "esm2_t33_650M_UR50D.pt",
         "esmfold_trunk": "esmfold_trunk_8M_stem.pt"}
CALIB = {"esm2_150M": "casp14:8", "esm2_650M": "casp14:8", "esmfold_trunk": "casp14:2"}

_TRUNK = """
import sys, torch
sys.path.insert(0, {here!r})
from make_random_checkpoints import esmfold_trunk_config
import ptq_protein as pp
from ptq_protein.models.loading import load_model
loaded = load_model({path!r}, config=esmfold_trunk_config(), mmap=True)
{body}
"""
_QUANTIZE_TRUNK = """q = pp.quantize(loaded.model, {recipe!r}, calibration={calib!r}, calib_max_length=128,
                num_recycles=0, inplace=True)
pp.save(q, {out!r}, force=True)"""
_FP_FORWARD = """
import torch
from ptq_protein.api import resolve_calibration, crop_sequence
from ptq_protein.models.adapters import get_adapter
{load}
adapter = get_adapter(loaded.model)
seqs = [crop_sequence(s, 128) for s in resolve_calibration({calib!r})[1]]
with torch.no_grad():
    for batch in adapter.batches(seqs, 4):
        adapter.forward(loaded.model, batch{extra})
"""


def case_commands(kind: str, path: Path, out: Path, recipe: str, low_memory: bool) -> dict:
    py = sys.executable
    calib = CALIB[kind]
    if kind == "esmfold_trunk":
        quant = _TRUNK.format(here=str(HERE), path=str(path),
                              body=_QUANTIZE_TRUNK.format(recipe=recipe, calib=calib, out=str(out)))
        load = _TRUNK.format(here=str(HERE), path=str(path), body="")
        return {"quantize": [py, "-c", quant],
                "fp": [py, "-c", _FP_FORWARD.format(load=load, calib=calib, extra=", num_recycles=0")]}
    cli = [py, "-m", "ptq_protein.cli.main", "quantize", str(path), "--preset", recipe, "--calib", calib,
           "--out", str(out), "--force", "--quiet", "--check", "0"] + (["--low-memory"] if low_memory else [])
    load = (f"from ptq_protein.models.loading import load_model\n"
            f"loaded = load_model({str(path)!r}, mmap=True, hash_weights=False)")
    return {"quantize": cli, "fp": [py, "-c", _FP_FORWARD.format(load=load, calib=calib, extra="")]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kinds", nargs="+", choices=list(FILES))
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ptq13_ckpt"))
    parser.add_argument("--recipe", default="w8a8-uniform")
    parser.add_argument("--low-memory", action="store_true", help="ESM-2: pass --low-memory to quantize")
    parser.add_argument("--no-fp", action="store_true", help="skip the float baseline")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved repeats (medians of the wall ratio)")
    args = parser.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="ptq13_bench_"))
    print("| model | fp32 file GB | mode | peak RSS GiB | RSS / file | quantize wall s (user, sys) | "
          "FP load+forward wall s (user) | wall ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in args.kinds:
        path = args.dir / FILES[kind]
        size = path.stat().st_size
        cmds = case_commands(kind, path, out / kind, args.recipe, args.low_memory)
        rounds = []
        for _ in range(args.rounds):  # interleaved: the machine's drift hits both commands alike
            rounds.append((run_timed(cmds["quantize"]), None if args.no_fp else run_timed(cmds["fp"])))
        mode = "low-memory" if args.low_memory else "default"
        for i, (q, fp) in enumerate(rounds):
            ratio = "" if fp is None else f"{q['wall_s'] / fp['wall_s']:.2f}x"
            fp_text = "" if fp is None else f"{fp['wall_s']:.0f} ({fp['user_s']:.0f})"
            label = kind if args.rounds == 1 else f"{kind}, round {i + 1}"
            print(f"| {label} | {size / 1e9:.2f} | {mode} | {q['rss_gib']:.2f} | "
                  f"{q['rss_gib'] * 2 ** 30 / size:.2f}x | "
                  f"{q['wall_s']:.0f} ({q['user_s']:.0f}, {q['sys_s']:.0f}) | {fp_text} | {ratio} |", flush=True)
        if args.rounds > 1 and not args.no_fp:
            ratios = sorted(q["wall_s"] / fp["wall_s"] for q, fp in rounds)
            print(f"{kind}: wall ratio median {statistics.median(ratios):.2f}x over {len(ratios)} interleaved rounds "
                  f"(min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
