"""The Quickstart's calibration: the study recipe's statistics in our pass's forwards vs a pass of their own (issue 18).

Toolkit check, random weights: tiny ESMFold, the Quickstart's calibration set
(casp14:50 cropped to 128 residues) and its recipes (``w8a8-pwlq``,
``w8a8-uniform``, ``study-w8a8-pwlq``), calibrated by
:func:`~ptq_protein.workflows.shared_calibration.calibrate_recipes` as ``quantize`` calls
it. Jobs run in turn, interleaved over ``--rounds``, in one process: the FP
forwards alone (batch 1), our pass alone, all three recipes with the study's
observers riding our batch-1 forwards (the default), and all three with the
study's pass on its own forwards (riding switched off, as before). Prints
medians and their ratios to the FP forwards.

    python -m scripts.bench study_pass --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from typing import Optional, Sequence
from unittest import mock

import torch

from ptq_protein.api import calibration_sequences
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.tiny import tiny_esmfold
from ptq_protein.workflows import shared_calibration

OURS = ["w8a8-pwlq", "w8a8-uniform"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calib", default="casp14:50")
    args = parser.parse_args(argv)
    model, _ = tiny_esmfold()
    adapter = get_adapter(model)
    _, seqs = calibration_sequences(adapter, args.calib, 128)

    def fp() -> None:
        with torch.no_grad():
            for seq in seqs:
                adapter.forward(model, adapter.make_batch([seq]))

    def calibrate(recipes, ride: bool = True):
        def run() -> None:
            with contextlib.nullcontext() if ride else mock.patch.object(shared_calibration, "study_can_ride",
                                                                           return_value=False):
                shared_calibration.calibrate_recipes(model, recipes, seqs, calib_max_length=128)
        return run

    jobs = {"FP forwards (batch 1)": fp, "our pass alone (batch 1)": calibrate(OURS),
            "ours + study's statistics, one set of forwards": calibrate(OURS + ["study-w8a8-pwlq"]),
            "ours + the study's own pass (before)": calibrate(OURS + ["study-w8a8-pwlq"], ride=False)}
    times = {name: [] for name in jobs}
    for _ in range(args.rounds):
        for name, job in jobs.items():
            start = time.perf_counter()
            job()
            times[name].append(time.perf_counter() - start)
    print(f"tiny-esmfold, {len(seqs)} sequences ({args.calib}, cropped to 128), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; toolkit check, random weights; medians of {args.rounds} "
          "interleaved rounds")
    print("| job | seconds | / FP forwards |\n|---|---|---|")
    base = statistics.median(times["FP forwards (batch 1)"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"| {name} | {med:.1f} | {med / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
