#!/usr/bin/env python
"""Fidelity of the integer-friendly PWLQ (``w8a8-pwlq-int``) against ``w8a8-pwlq`` and ``w8a8-uniform`` (issue 28).

Fake backend (the simulation of record), seeded random models (a toolkit check, not biology):

* tiny ESM-2 with the demo outlier channels and without them, and the outlier ESM-2 built with
  ``models/outliers.py``'s planted channels at the bench's 12 x 480 shape: logits relative error vs FP;
The tiny-ESMFold row (TM-score of each recipe's prediction against the FP model's) comes from the CLI::

    ptq-protein eval structure --model tiny-esmfold --recipes fp,w8a8-uniform,w8a8-pwlq,w8a8-pwlq-int \
        --set cameo139 --targets 7WWR_A,7MLA_B,7QAO_A --calib casp14:3 --calib-max-length 48 --num-recycles 0 \
        --quiet --out /tmp/struct28

    python -m scripts.bench fidelity_pwlq_int            # about a minute on one core
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import FULL_SHAPE, build_esm2, markdown_table, random_sequences  # noqa: E402

RECIPES = ("w8a8-uniform", "w8a8-pwlq", "w8a8-pwlq-int")


def logits_errors(model, calib: List[str], test: List[str]) -> Dict[str, float]:
    import ptq_protein as pp
    from ptq_protein.models.adapters import get_adapter

    tokens = get_adapter(model).make_batch(test).inputs["tokens"]
    with torch.no_grad():
        ref = model(tokens)["logits"].double()
        out = {}
        for recipe in RECIPES:
            q = pp.quantize(model, recipe, calibration=calib)
            out[recipe] = float((q(tokens)["logits"].double() - ref).norm() / ref.norm())
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    from ptq_protein.models.tiny import tiny_esm2

    torch.manual_seed(0)
    calib, test = random_sequences(8, 64, seed=1), random_sequences(4, 64, seed=2)
    rows = []
    for label, model in (("tiny-esm2, demo outliers", tiny_esm2(seed=0)[0]),
                         ("tiny-esm2, no outliers", tiny_esm2(seed=0, outliers=None)[0]),
                         ("ESM-2 12 x 480, planted outliers (bench model)", build_esm2(FULL_SHAPE)[0])):
        errs = logits_errors(model, calib, test)
        rows.append([label] + [f"{errs[r]:.2%}" for r in RECIPES]
                    + [f"{errs['w8a8-pwlq-int'] / errs['w8a8-pwlq']:.2f}"])
    print("## Logits relative error vs FP (fake backend; random weights)\n")
    print(markdown_table(["model", *RECIPES, "pwlq-int / pwlq"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
