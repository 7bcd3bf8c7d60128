#!/usr/bin/env python
"""Sensitivity cost and ``--auto`` against single-width presets (issue 15). Toolkit check, random weights.

1. ``sensitivity``: tiny ESMFold, w8a8-pwlq, metric tm, every site one unit, on 5 targets
   (cameo139:5, cropped to ``--crop`` residues). Reports wall time (calibration included) over
   units x FP fold time, where the FP fold time is the median of ``--reps`` timed FP passes over
   the same 5 targets, measured in the same process just before.
2. ``auto``: on tiny ESMFold (budget ``tm>=0.99``) and the outlier tiny ESM-2 (``logits_rel<=0.02``),
   the searched plan's average width and held-out metric against every single-width plan
   (each preset's precision on every unit) measured on the same held-out sequences with the
   same calibration statistics; the best single width meeting the budget is the comparison.

    OMP_NUM_THREADS=1 python -m scripts.bench search            # full run (~15 min on 1 busy core)
    OMP_NUM_THREADS=1 python -m scripts.bench search --quick    # ESM-2 auto only (smoke test)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

import ptq_protein as pp
from ptq_protein.data.sets import load_set
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.tiny import tiny_esm2, tiny_esmfold
from ptq_protein.recipes.site_plan import UnitChoice
from ptq_protein.search.auto import AUTO_SCOPE, UnitCosts, single_width_baselines
from ptq_protein.search.budget import Budget
from ptq_protein.search.metrics import Scorer
from ptq_protein.search.sensitivity import sensitivity
from ptq_protein.search.units import make_units
from ptq_protein.search.workbench import Workbench

# The presets as single-width plans (every unit at the same choice).
PRESET_CHOICES = {"w8a8-pwlq": "w8a8-pwlq", "w8a8-uniform": "w8a8-uniform", "w6a6-pwlq": "w6a6-pwlq",
                  "w4a8-pwlq": "w4a8-pwlq", "w8-only": "w8", "w4-only": "w4", "a8-pwlq": "a8-pwlq",
                  "a8-uniform": "a8-uniform"}


def _seqs(spec: str, crop: int) -> List[str]:
    return [s[:crop] for s in load_set(spec).sequences()]


def bench_sensitivity(crop: int, reps: int, recycles: Optional[int]) -> Dict[str, Any]:
    model, _ = tiny_esmfold(seed=0)
    targets, calib = _seqs("cameo139:5", crop), _seqs("casp14:8", crop)
    extra = {} if recycles is None else {"num_recycles": recycles}
    probe = Scorer(model, get_adapter(model), "tm", targets, extra)
    fold_times = []
    for _ in range(reps):
        start = time.perf_counter()
        probe.score(model)
        fold_times.append(time.perf_counter() - start)
    fold = statistics.median(fold_times)
    start = time.perf_counter()
    result = sensitivity(model, "w8a8-pwlq", targets, metric="tm", unit="site", calibration=calib,
                         num_recycles=recycles)
    wall = time.perf_counter() - start
    units = result["timing"]["units"]
    return {"units": units, "fp_fold_5_targets_s": fold, "wall_s": wall, "ratio": wall / (units * fold),
            "timing": result["timing"], "top5": [(r["unit"], r["loss"]) for r in result["rows"][:5]]}


def bench_auto(name: str, model, budget: str, search: List[str], held: List[str], calib: List[str],
               unit: str, recycles: Optional[int] = None) -> Dict[str, Any]:
    start = time.perf_counter()
    qmodel = pp.quantize(model, "auto", calibration=calib, budget=budget, unit=unit, search_set=search, holdout=held,
                         num_recycles=recycles)
    auto_s = time.perf_counter() - start
    plan = qmodel.ptq_state.plan
    parsed = Budget.parse(budget)
    bench = Workbench(model, AUTO_SCOPE, calib, num_recycles=recycles)
    units = make_units(bench.sites, unit)
    scorer = Scorer(bench.model, bench.adapter, parsed.metric, held, bench.forward_kwargs)
    menu = [UnitChoice.parse(c) for c in PRESET_CHOICES.values()]
    rows = single_width_baselines(bench, scorer, units, menu, UnitCosts(units, bench.weight_numel()))
    for row, preset in zip(rows, PRESET_CHOICES):
        row["preset"] = preset
        row["meets"] = parsed.metric_holds(row)
    meeting = [r for r in rows if r["meets"]]
    best = min(meeting, key=lambda r: r["avg_bits"]) if meeting else None
    return {"model": name, "budget": budget, "unit": unit, "auto_avg_bits": plan.avg_bits,
            "auto_heldout": dict(plan.verified), "auto_s": auto_s, "kept_moves": qmodel.ptq_search.kept,
            "moves": len(qmodel.ptq_search.moves), "plan": [(u, c) for u, c, _ in plan.units],
            "baselines": rows, "best_single": best}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="ESM-2 auto only (smoke test)")
    parser.add_argument("--parts", default="auto-esm2,auto-esmfold,sensitivity",
                        help="comma list of auto-esm2, auto-esmfold, sensitivity (run them in separate "
                             "processes at will)")
    parser.add_argument("--crop", type=int, default=64, help="residues kept per sequence (the first N)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--recycles", type=int, help="ESMFold recycles everywhere (default: the model's, 2 for tiny)")
    parser.add_argument("--json", help="write the results here (rewritten after each part)")
    args = parser.parse_args(argv)
    parts = ["auto-esm2"] if args.quick else [p.strip() for p in args.parts.split(",")]
    facts = {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
             "machine": platform.machine(), "crop": args.crop, "recycles": args.recycles}
    out: Dict[str, Any] = {"facts": facts}
    for part in parts:
        if part == "auto-esm2":
            crop = 2 * args.crop
            out[part] = bench_auto("tiny-esm2 (outliers)", tiny_esm2(seed=0)[0], "logits_rel<=0.02",
                                   _seqs("cameo139:5", crop), _seqs("cameo2022:5", crop), _seqs("casp14:8", crop),
                                   unit="site")
        elif part == "auto-esmfold":
            out[part] = bench_auto("tiny-esmfold", tiny_esmfold(seed=0)[0], "tm>=0.99", _seqs("cameo139:5", args.crop),
                                   _seqs("cameo2022:5", args.crop), _seqs("casp14:8", args.crop), unit="layer",
                                   recycles=args.recycles)
        elif part == "sensitivity":
            out[part] = bench_sensitivity(args.crop, args.reps, args.recycles)
        else:
            raise SystemExit(f"unknown part {part!r}")
        text = json.dumps(out, indent=2, default=str)
        print(text, flush=True)
        if args.json:
            with open(args.json, "w") as handle:
                handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
