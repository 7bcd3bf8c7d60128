#!/usr/bin/env python
"""Reproduce the PTQ-of-ESMFold study's table with ``ptq-protein eval structure``.

Protocol of "Exploring Post-Training Quantization of Protein Language Models"
(github.com/pengshuang/PTQ4Protein): ESMFold v1, activations calibrated on the
first 50 CASP14 sequences (``casp14:50``), mean TM-score over the 139 CAMEO
targets (``cameo139``), residues paired by number. Recipes: FP, 8-bit uniform
and piecewise-linear activations alone, W8 + uniform A8, W8 + PWLQ A8, and W8
alone. Needs the ESMFold v1 weights on disk (``--weights`` or the usual caches);
a GPU makes the 139 x 6 folds take minutes instead of hours.

    python scripts/reproduce_study.py --out runs/study --device auto
    python scripts/reproduce_study.py --model tiny-esmfold --limit 5 --out runs/study-tiny   # toolkit check

The run is resumable (rerun the same command after an interruption). Prints our
mean TM-score beside the published one; the full outputs (results.csv,
summary.md, the plot, the PDBs) are in ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

# Published mean TM-scores on cameo139 (ESMFold v1, calibration casp14:50), as quoted in
# /work/shared/data/README.md from the study (github.com/pengshuang/PTQ4Protein).
PUBLISHED_FP32 = 0.8009
PUBLISHED_UNIFORM_A8 = 0.6850
PUBLISHED_PWLQ_A8 = 0.7997
PUBLISHED_W8_PWLQ_A8 = 0.7984

# Our recipe -> (the study's row name, its published mean TM-score or None when it has none).
STUDY_ROWS = {
    "fp": ("FP32", PUBLISHED_FP32),
    "a8-uniform": ("uniform A8", PUBLISHED_UNIFORM_A8),
    "a8-pwlq": ("PWLQ A8", PUBLISHED_PWLQ_A8),
    "w8a8-uniform": ("W8 + uniform A8", None),
    "w8a8-pwlq": ("W8 + PWLQ A8", PUBLISHED_W8_PWLQ_A8),
    "w8-only": ("W8 only", None),
}
STUDY_MODEL, STUDY_SET, STUDY_CALIBRATION = "esmfold", "cameo139", "casp14:50"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    from ptq_protein.cli.main import main as cli

    command = ["eval", "structure", "--model", args.model, "--recipes", ",".join(args.recipes),
               "--set", STUDY_SET, "--calib", STUDY_CALIBRATION, "--out", str(args.out), "--device", args.device,
               "--calib-max-length", "0"]  # the study calibrated on whole sequences
    for flag, value in (("--weights", args.weights), ("--limit", args.limit), ("--num-recycles", args.num_recycles)):
        if value is not None:
            command += [flag, str(value)]
    code = cli(command)
    if code != 0:
        return code
    print(format_table(mean_tm_scores(args.out / "results.csv", args.recipes), args.model))
    return 0


def mean_tm_scores(results_csv: Path, recipes: Sequence[str]) -> Dict[str, tuple]:
    """{recipe: (mean TM-score, targets scored)} over the scored rows of ``results_csv``."""
    from ptq_protein.eval.bench.summary import MetricSpec, summarize

    with open(results_csv, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {s.recipe: (s.mean, s.n) for s in summarize(rows, list(recipes), MetricSpec("tm_score", "TM-score"))}


def format_table(ours: Dict[str, tuple], model: str) -> str:
    """Markdown table: recipe, the study's row name, our mean TM-score (n), the published one, difference."""
    lines = ["| recipe | study row | ours (n) | published | ours − published |", "| --- | --- | ---: | ---: | ---: |"]
    for recipe, (mean, n) in ours.items():
        label, published = STUDY_ROWS.get(recipe, (recipe, None))
        diff = "—" if published is None else f"{mean - published:+.4f}"
        lines.append(f"| {recipe} | {label} | {mean:.4f} ({n}) | {'—' if published is None else f'{published:.4f}'} "
                     f"| {diff} |")
    if model != STUDY_MODEL:
        lines.append(f"\nModel {model!r} is not the study's ESMFold v1: the published column does not apply.")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/study"), help="output folder (default runs/study)")
    p.add_argument("--model", default=STUDY_MODEL, help="default esmfold (ESMFold v1), as in the study")
    p.add_argument("--weights", help="ESMFold checkpoint file or Hugging Face folder")
    p.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto"])
    p.add_argument("--recipes", type=lambda s: s.split(","), default=list(STUDY_ROWS),
                   help=f"default: {','.join(STUDY_ROWS)}")
    p.add_argument("--limit", type=int, help="only the first N cameo139 targets (a partial check)")
    p.add_argument("--num-recycles", type=int, help="ESMFold recycles (default: the model's, as in the study)")
    return p


if __name__ == "__main__":
    sys.exit(main())
