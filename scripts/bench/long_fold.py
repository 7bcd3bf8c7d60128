"""Peak memory and time of folding long sequences: FP32 (unchunked, chunked), bf16, pair int8.

Toolkit check, random weights: nothing here measures biology. Models:

* ``real2``: ESMFold with the v1 trunk's real widths (c_s 1024, c_z 128, head width 32:
  32 sequence heads and 4 pair heads; the v1 structure module), 2 trunk blocks (memory
  is per block: blocks run one after another), a 2-layer 320-wide ESM-2 stem, seeded
  random weights;
* ``tiny``: ``tiny-esmfold``.

Each row folds one random sequence in a fresh process (``--child``), 0 recycles; the
peak is the child's ``VmHWM`` (peak resident set size, which another busy process on
the machine barely moves). Beside it, the memory model's prediction
(:mod:`ptq_protein.models.fold_memory`). Then, per mode, the longest length whose
*predicted* peak fits ``--budget-gib``.

``--longest GIB`` measures instead of predicting: per mode, the longest length the
model lets through under GIB is folded (fresh process) and its measured peak is
checked against the budget; over it, a shorter length is folded (at most 3 retries).

    python -m scripts.bench long_fold --quick            # a few rows, minutes
    python -m scripts.bench long_fold --out bench.json   # the full table (long: L = 2048 rows)
    python -m scripts.bench long_fold --longest 1.5      # measured longest L under 1.5 GiB, FP32 chunk 32 vs pair int8
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from typing import Dict, List, Optional

from bench.common import module_child

MODES = {  # name -> (dtype, chunk, pair_bits)
    "fp32": ("float32", None, None), "fp32-c128": ("float32", 128, None), "fp32-c64": ("float32", 64, None),
    "fp32-c32": ("float32", 32, None), "bf16-c64": ("bfloat16", 64, None), "pair8-c64": ("float32", 64, 8),
    "pair8-c16": ("float32", 16, 8),
}
LENGTHS = (256, 512, 1024, 2048)
LONGEST_MODES = ("fp32-c32", "pair8-c16")  # FP32 with a small chunk (its longest predicted but chunk 4) vs int8
LONGEST_RETRIES = 3  # folds at shorter lengths when the measured peak is over the budget
QUICK = [("real2", "fp32-c64", 256), ("real2", "pair8-c16", 256), ("tiny", "fp32", 256), ("tiny", "pair8-c16", 256)]
_AA = "ACDEFGHIKLMNPQRSTVWY"


def build(model: str):
    """The benchmark model, float32, eval mode."""
    import torch
    from transformers import EsmConfig, EsmForProteinFolding

    from ptq_protein.models.esmfold_convert import esmfold_v1_config
    from ptq_protein.models.tiny import seeded_init_, tiny_esmfold

    if model == "tiny":
        return tiny_esmfold(seed=0)[0]
    base = esmfold_v1_config().to_dict()
    base.update(num_hidden_layers=2, hidden_size=320, num_attention_heads=20, intermediate_size=1280)
    base["esmfold_config"]["trunk"].update(num_blocks=2, chunk_size=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = EsmForProteinFolding(EsmConfig(**base))
    return seeded_init_(net, 0).eval()


def sequence(length: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(_AA) for _ in range(length))


def _vm(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(key)


def child(model: str, mode: str, length: int) -> Dict:
    """Fold one sequence in this process; print its peak and time as JSON."""
    import torch

    from ptq_protein.eval.bench.folding import fold_one
    from ptq_protein.models.fold_memory import FoldPlan, dims_of, predict_peak

    dtype, chunk, pair_bits = MODES[mode]
    net = build(model).to(getattr(torch, dtype))
    net.trunk.set_chunk_size(chunk)
    if pair_bits:
        from ptq_protein.nn.pair_int8 import use_pair_int8

        use_pair_int8(net, pair_bits)
    before = _vm("VmRSS")
    start = time.perf_counter()
    fold_one(net, sequence(length), num_recycles=0, max_memory=1 << 40)  # the row's chunk, whatever the machine has
    seconds = time.perf_counter() - start
    predicted = predict_peak(dims_of(net), FoldPlan(length, 1, chunk, pair_bits))
    return {"model": model, "mode": mode, "length": length, "peak_bytes": _vm("VmHWM"), "rss_before": before,
            "predicted_bytes": predicted, "seconds": seconds, "threads": torch.get_num_threads()}


def fidelity(model: str, length: int, num_recycles: int = 0, seed: int = 0) -> Dict:
    """TM-score of the pair-int8 fold against the float fold, the pair state's relative error after each block,
    and the share of pair vectors kept exact (crest factor over the threshold)."""
    import copy

    from ptq_protein.eval.bench.folding import fold_one
    from ptq_protein.eval.structure import as_structure
    from ptq_protein.eval.tmscore import tm_score
    from ptq_protein.nn.pair_int8 import block as int8_block
    from ptq_protein.nn.pair_int8 import use_pair_int8

    net, seq = build(model), sequence(length, seed)
    float_pairs, int8_pairs, vectors = [], [], [0, 0]
    hooks = [b.register_forward_hook(lambda m, i, o: float_pairs.append(o[1].detach().clone()))
             for b in net.trunk.blocks]
    pdb_fp = fold_one(net, seq, num_recycles=num_recycles, max_memory=1 << 40)[0]
    for h in hooks:
        h.remove()
    original = int8_block.block_forward

    def recording(*args, **kwargs):
        s, z = original(*args, **kwargs)
        int8_pairs.append(z.read(rows=slice(0, z.shape[1])))
        vectors[0] += z.outlier_count
        vectors[1] += z.codes[..., 0].numel()
        return s, z

    quantized = use_pair_int8(copy.deepcopy(net), 8)
    int8_block.block_forward = recording
    try:
        import ptq_protein.nn.pair_int8.trunk as trunk_module

        trunk_module.block_forward = recording
        pdb_q = fold_one(quantized, seq, num_recycles=num_recycles, max_memory=1 << 40)[0]
    finally:
        int8_block.block_forward = trunk_module.block_forward = original
    errors = [float((q - f).norm() / f.norm()) for q, f in zip(int8_pairs, float_pairs)]
    tm = tm_score(as_structure(pdb_q), as_structure(pdb_fp), pairing="number").tm_score
    return {"model": model, "length": length, "seed": seed, "tm_vs_fp": tm, "pair_rel_error_per_block": errors,
            "outlier_share": vectors[0] / max(vectors[1], 1), "note": "random weights: a toolkit check"}


def run_row(model: str, mode: str, length: int, timeout: Optional[float]) -> Dict:
    cmd = [*module_child(__file__), "--child", model, mode, str(length)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": model, "mode": mode, "length": length, "error": f"over {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"model": model, "mode": mode, "length": length, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def longest_fitting(model: str, mode: str, budget: int) -> int:
    """The longest L whose predicted peak is within ``budget`` bytes, in this mode."""
    import torch

    from ptq_protein.eval.bench.fold_budget import longest_fitting as longest

    dtype, chunk, pair_bits = MODES[mode]
    return longest(build(model).to(getattr(torch, dtype)), budget, pair_bits, chunk)


def measured_longest(model: str, modes, budget: int, timeout: Optional[float]) -> List[Dict]:
    """Folds of each mode around the longest length predicted to fit ``budget`` bytes: every attempt a row.

    Over the budget, a retry shrinks the length by the square root of the fold's own memory over what the budget
    leaves it (that memory grows as L^2), and 2% more. The first mode is the baseline: when it fits, it is also
    folded 5% longer, so that its measured longest length has a bound on both sides.
    """
    rows: List[Dict] = []
    for index, mode in enumerate(modes):
        predicted = length = longest_fitting(model, mode, budget)
        attempts: List[Dict] = []
        while length >= 1 and len(attempts) <= LONGEST_RETRIES:
            row = run_row(model, mode, length, timeout)
            row.update(predicted_longest=predicted, budget_bytes=budget,
                       fits="error" not in row and row["peak_bytes"] <= budget)
            attempts.append(row)
            fitted = any(r["fits"] for r in attempts)
            over = any(not r["fits"] for r in attempts)
            if "error" in row or (fitted and (over or index > 0)):
                break
            if row["fits"]:
                length = int(length * 1.05) + 1
            else:
                own, allowed = row["peak_bytes"] - row["rss_before"], budget - row["rss_before"]
                length = int(length * 0.98 * max(allowed, 0) ** 0.5 / own ** 0.5)
        rows += attempts
    return rows


def longest_table(rows: List[Dict]) -> str:
    out = ["| model | mode | longest L predicted | L folded | peak GiB measured | predicted | budget GiB | fits "
           "| time s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        measured = ("—", "—", r["error"]) if "error" in r else (
            f"{r['peak_bytes'] / 2**30:.2f}", f"{r['predicted_bytes'] / 2**30:.2f}", f"{r['seconds']:.0f}")
        out.append(f"| {r['model']} | {r['mode']} | {r['predicted_longest']} | {r['length']} | {measured[0]} | "
                   f"{measured[1]} | {r['budget_bytes'] / 2**30:g} | {'yes' if r['fits'] else 'no'} | {measured[2]} |")
    bounds = {}
    for r in rows:
        low, high = bounds.get(r["mode"], (0, None))
        if r["fits"]:
            low = max(low, r["length"])
        elif "error" not in r:
            high = r["length"] if high is None else min(high, r["length"])
        bounds[r["mode"]] = (low, high)
    for mode, (low, high) in bounds.items():
        out.append(f"{mode}: measured to fit at L = {low}" + ("" if high is None else f", over at L = {high}"))
    if len(bounds) >= 2:
        (base, (b_low, b_high)), *others = bounds.items()
        for mode, (low, _) in others:
            ratio = f"> {low / b_high:.2f}x (over {base}'s shortest length over budget)" if b_high else (
                f"{low / b_low:.2f}x (no {base} fold over budget measured: not a bound)")
            out.append(f"{mode} / {base}: {ratio}")
    return "\n".join(out)


def table(rows: List[Dict]) -> str:
    out = ["| model | mode | L | peak GiB (measured) | predicted GiB | error | time s |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | {r['mode']} | {r['length']} | — | — | — | {r['error']} |")
            continue
        err = r["predicted_bytes"] / r["peak_bytes"] - 1
        out.append(f"| {r['model']} | {r['mode']} | {r['length']} | {r['peak_bytes'] / 2**30:.2f} | "
                   f"{r['predicted_bytes'] / 2**30:.2f} | {err:+.0%} | {r['seconds']:.1f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs=3, metavar=("MODEL", "MODE", "L"), help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="a few short rows (minutes)")
    p.add_argument("--rows", nargs="*", default=None, help="MODEL:MODE:L rows to run (default: the full table)")
    p.add_argument("--budget-gib", type=float, default=16.0, help="memory budget for the longest-L column")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per row")
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--fidelity", nargs="*", metavar="MODEL:L[:SEED]",
                   help="instead of memory rows: TM-score of pair int8 vs float and per-block pair error")
    p.add_argument("--longest", type=float, metavar="GIB",
                   help="instead of the table: fold at the longest L predicted under GIB and measure its peak")
    p.add_argument("--model", choices=("real2", "tiny"), default="real2", help="model of --longest")
    p.add_argument("--modes", nargs="+", choices=sorted(MODES), default=list(LONGEST_MODES),
                   help="modes of --longest")
    args = p.parse_args(argv)
    if args.longest is not None and args.longest <= 0:
        p.error(f"--longest {args.longest:g}: give a positive budget in GiB, e.g. --longest 1.5")
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], int(args.child[2]))))
        return 0
    if args.fidelity is not None:
        for item in args.fidelity or ["tiny:128", "tiny:256", "real2:256"]:
            name, length, *seed = item.split(":")
            print(json.dumps(fidelity(name, int(length), seed=int(seed[0]) if seed else 0)), flush=True)
        return 0
    if args.longest is not None:
        rows = measured_longest(args.model, args.modes, int(args.longest * 2**30), args.timeout)
        print(longest_table(rows))
        if args.out:
            with open(args.out, "w") as fh:
                json.dump({"longest": rows, "threads": os.environ.get("OMP_NUM_THREADS")}, fh, indent=1)
        return 0
    if args.rows is not None:
        plan = [(m, mode, int(n)) for m, mode, n in (r.split(":") for r in args.rows)]
    elif args.quick:
        plan = QUICK
    else:
        plan = [("real2", mode, n) for n in LENGTHS for mode in MODES if not (mode == "fp32" and n > 512)]
        plan += [("tiny", mode, n) for n in (128, 256, 512) for mode in ("fp32", "fp32-c64", "pair8-c16")]
    rows = []
    for model, mode, length in plan:
        rows.append(run_row(model, mode, length, args.timeout))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    budget = int(args.budget_gib * 2**30)
    for model in sorted({m for m, _, _ in plan}):
        fits = {mode: longest_fitting(model, mode, budget) for mode in MODES}
        print(f"{model}: longest L under {args.budget_gib:g} GiB (predicted): "
              + ", ".join(f"{k} {v}" for k, v in fits.items()))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"rows": rows, "threads": os.environ.get("OMP_NUM_THREADS")}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
