"""The study's batch-1 calibration pass vs the plain FP forwards it rides on (issue 18).

Toolkit check, random weights: tiny ESMFold, the Quickstart's calibration set
(casp14:50 cropped to 128 residues), one sequence per forward. Three jobs run in
turn, interleaved over ``--rounds``, in one process: the FP forwards alone, the
study pass with the observer's exact pre-filter (:func:`extremes`), and the same
pass with two plain ``torch.topk`` calls per call (the pre-filter switched off).
Prints medians and their ratios to the FP forwards.

    python scripts/bench_study_pass.py --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import ptq_protein.quant.study_observer as study_observer
from ptq_protein.api import calibration_sequences
from ptq_protein.calibration.sites import discover_sites
from ptq_protein.calibration.study import study_calibrate
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.tiny import tiny_esmfold
from ptq_protein.recipes.study import STUDY_KINDS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calib", default="casp14:50")
    args = parser.parse_args()
    model, _ = tiny_esmfold()
    adapter = get_adapter(model)
    adapter.prepare(model)
    _, seqs = calibration_sequences(adapter, args.calib, 128)
    sites = [s for s in discover_sites(model, adapter) if s.kind in STUDY_KINDS]
    prefilter = study_observer._PREFILTER_MIN

    def fp() -> None:
        with torch.no_grad():
            for seq in seqs:
                adapter.forward(model, adapter.make_batch([seq]))

    def study(min_size: int):
        def run() -> None:
            study_observer._PREFILTER_MIN = min_size
            try:
                study_calibrate(model, adapter, sites, seqs, k=2, calls=50)
            finally:
                study_observer._PREFILTER_MIN = prefilter
        return run

    jobs = {"FP forwards (batch 1)": fp, "study pass, pre-filtered extremes": study(prefilter),
            "study pass, plain topk": study(1 << 62)}
    times = {name: [] for name in jobs}
    for _ in range(args.rounds):
        for name, job in jobs.items():
            start = time.perf_counter()
            job()
            times[name].append(time.perf_counter() - start)
    print(f"tiny-esmfold, {len(seqs)} sequences ({args.calib}, cropped to 128), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; toolkit check, random weights; medians of {args.rounds} interleaved rounds")
    print("| job | seconds | / FP forwards |\n|---|---|---|")
    base = statistics.median(times["FP forwards (batch 1)"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"| {name} | {med:.1f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
