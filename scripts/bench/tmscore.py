#!/usr/bin/env python
"""Time batched TM-score (``ptq_protein.eval``) against tmtools on the same 100 pairs, side by side.

Usage::

    python -m scripts.bench tmscore                 # CPU, 3 interleaved rounds
    python -m scripts.bench tmscore --device cuda --rounds 5 --threads 2
    python -m scripts.bench tmscore --device numpy  # the search on numpy arrays (what tm_score runs)

The pairs are the 100 golden cases of ``tests/eval/data`` (noise, hinge,
register shift, unrelated, missing residues, short chains, EigenFold
predictions; 12-513 paired residues). Each round times, one after the other on
identical paired CA coordinates: our ``tm_score_batch`` on all 100 pairs,
``tmtools.tm_align`` with its own structural alignment (the default), and
``tmtools.tm_align`` with the identity alignment fixed (closest to TMscore).
Rounds are interleaved so that background load hits every contender alike;
the table reports the median round. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "eval" / "data"


def load_pairs() -> tuple:
    from ptq_protein.eval.tmscore import paired_ca

    cases = json.loads((DATA / "golden_tmscore.json").read_text())["cases"]
    pairs, lengths = [], []
    for case in cases:
        model, native, length = paired_ca(DATA / "structures" / case["model"], DATA / "structures" / case["native"],
                                          case["pairing"])
        pairs.append((model, native))
        lengths.append(length)
    return pairs, lengths


def time_ours(pairs: list, lengths: list, device: str) -> float:
    import torch

    from ptq_protein.eval.tmscore import tm_score_batch

    if device == "numpy":
        moved = pairs
    else:
        moved = [(torch.as_tensor(m, device=device), torch.as_tensor(n, device=device)) for m, n in pairs]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    tm_score_batch(moved, lengths)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def time_tmtools(pairs: list, fixed: bool) -> float:
    import numpy as np
    import tmtools

    start = time.perf_counter()
    for model, native in pairs:
        seq = "A" * len(model)
        alignment = [seq, seq] if fixed else None
        tmtools.tm_align(np.ascontiguousarray(model), np.ascontiguousarray(native), seq, seq, alignment)
    return time.perf_counter() - start


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="a torch device, or numpy (default: cpu)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    pairs, lengths = load_pairs()
    time_ours(pairs[:2], lengths[:2], args.device)  # warm-up (CUDA context, allocator)
    rounds = {"ours": [], "tmtools": [], "tmtools_fixed": []}
    for _ in range(args.rounds):
        rounds["ours"].append(time_ours(pairs, lengths, args.device))
        rounds["tmtools"].append(time_tmtools(pairs, fixed=False))
        rounds["tmtools_fixed"].append(time_tmtools(pairs, fixed=True))
    med = {k: statistics.median(v) for k, v in rounds.items()}
    n = len(pairs)
    residues = sum(len(m) for m, _ in pairs)
    print(f"{n} pairs, {residues} paired residues in all; device {args.device}, torch threads "
          f"{torch.get_num_threads()}; median of {args.rounds} interleaved rounds\n")
    print("| method | total (s) | per pair (ms) | tmtools time / this |")
    print("| --- | ---: | ---: | ---: |")
    for key, label in (("ours", "ptq_protein.eval.tm_score_batch (TMscore search)"),
                       ("tmtools", "tmtools.tm_align (structural alignment)"),
                       ("tmtools_fixed", "tmtools.tm_align (fixed identity alignment)")):
        print(f"| {label} | {med[key]:.3f} | {1e3 * med[key] / n:.1f} | {med['tmtools'] / med[key]:.2f} |")
    print(f"\nspeed-up over tmtools: {med['tmtools'] / med['ours']:.2f}x (structural), "
          f"{med['tmtools_fixed'] / med['ours']:.2f}x (fixed alignment)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
