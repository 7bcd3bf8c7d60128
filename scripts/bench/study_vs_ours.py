#!/usr/bin/env python
"""Study-exact activation quantizers vs ours, per model part, at equal label and at equal storage.

The study's pwlq-3 at "8 bits" stores 9 bits per value (an 8-bit centre code, an
8-bit tail code and the choice between them); ours at 8 bits stores 8. So each
part is quantized with: the study's uniform and pwlq-3 at 8 bits, ours at 8 bits
(equal label) and our PWLQ at 9 bits (equal storage with the study's PWLQ).
Fidelity against the float model on held-out sequences: CA TM-score / relative
error of the structure (ESMFold), relative error of the logits and top-1
agreement (ESM-2). Weights stay FP. Tiny random models: a toolkit check, never
biology.

    python -m scripts.bench study_vs_ours                  # tiny-esmfold and tiny-esm2
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from typing import Dict, List, Optional, Sequence

import torch

PARTS = {"tiny-esmfold": (("esm",), ("trunk",), ("structure",)), "tiny-esm2": (None,)}


def recipes(group: Optional[tuple]) -> Dict[str, object]:
    """{label: config} for one model part (``None`` = every part)."""
    import ptq_protein as pp

    def part(cfg):
        return cfg.replace(groups=group)

    ours_pwlq = pp.get_preset("a8-pwlq")
    ours9 = ours_pwlq.replace(activations=dataclasses.replace(ours_pwlq.activations, bits=9), name="a9-pwlq")
    return {
        "study uniform 8 (8 b/value)": part(pp.get_preset("study-a8-uniform")),
        "ours uniform 8 (8 b/value)": part(pp.get_preset("a8-uniform")),
        "study pwlq-3 8 (9 b/value)": part(pp.get_preset("study-a8-pwlq")),
        "ours PWLQ 8 (8 b/value)": part(ours_pwlq),
        "ours PWLQ 9 (9 b/value)": part(ours9),
    }


def _crop(seqs: Sequence[str], n: int, length: int) -> List[str]:
    return [s[:length] for s in seqs[:n]]


def run(model_name: str, calib: List[str], held_out: List[str]) -> List[tuple]:
    import ptq_protein as pp
    from ptq_protein.eval.bench.fidelity import compare_models
    from ptq_protein.models.loading import load_model

    model = load_model(model_name).model
    rows = []
    for group in PARTS[model_name]:
        for label, cfg in recipes(group).items():
            qmodel = pp.quantize(model, cfg, calibration=calib)
            metrics = compare_models(model, qmodel, held_out)
            rows.append((model_name, "all" if group is None else group[0], label, metrics))
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calib", type=int, default=4, help="casp14 calibration sequences (default 4)")
    p.add_argument("--eval", type=int, default=2, help="held-out cameo139 sequences (default 2)")
    p.add_argument("--length", type=int, default=32, help="crop every sequence to its first N residues")
    p.add_argument("--models", default="tiny-esmfold,tiny-esm2")
    args = p.parse_args(argv)
    from ptq_protein.data.sets import load_set

    torch.manual_seed(0)
    calib = _crop(list(load_set("casp14").sequences()), args.calib, args.length)
    held_out = _crop(list(load_set("cameo139").sequences()), args.eval, args.length)
    start = time.perf_counter()
    rows = [r for m in args.models.split(",") for r in run(m, calib, held_out)]
    print(f"`python -m scripts.bench study_vs_ours {' '.join(argv if argv is not None else sys.argv[1:])}`; "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{time.perf_counter() - start:.0f} s. Toolkit check on random weights, activations only.\n")
    print("| model | part | recipe | TM vs FP | relative error | top-1 agreement |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for model, part, label, m in rows:
        cells = [f"{m[k]:.4f}" if k in m else "—" for k in ("tm_vs_fp", "relative_error", "top1_agreement")]
        print(f"| {model} | {part} | {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
