"""``ptq-protein sensitivity``: which sites, layers or model parts cost the most, by a protein metric."""

from __future__ import annotations

import argparse

from ptq_protein.cli.common import (
    add_batch_size_option,
    add_calib_crop_option,
    add_json_option,
    add_runtime_options,
    calib_crop,
    print_json,
)
from ptq_protein.cli.models_arg import MODEL_HELP, add_model_options, load_float_model

EXAMPLES = """examples:
  ptq-protein sensitivity tiny-esmfold --recipe w8a8-pwlq --set cameo139:5 --metric tm --unit part --out runs/sens
  ptq-protein sensitivity tiny-esm2 --recipe w8a8-uniform --set cameo139:5 --metric logits --out runs/sens-lm
  ptq-protein sensitivity esmfold --unit layer --metric contacts --set cameo139:20 --out runs/sens-layers

Each unit is quantized alone with --recipe (the rest FP) and measured against the FP model's own outputs;
calibration runs once. Outputs in --out: sensitivity.csv (ranked), summary.md, sensitivity.png, progress.csv
and run.json (rerunning the same command resumes). Metrics: tm (ESMFold), contacts (both), logits (ESM-2 LMs).
ESMFold: every unit folds every sequence, and it has hundreds of sites: start with --unit part, then layer.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("sensitivity", help="rank sites / layers / parts by the metric loss of quantizing each",
                              description="Per-unit sensitivity by TM-score, contact precision or logits vs FP.",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--recipe", default="w8a8-pwlq", help="preset giving each unit's precision (default w8a8-pwlq)")
    p.add_argument("--set", dest="set_spec", default="cameo139:5",
                   help="sequences the metric is measured on: NAME:N or a FASTA (default cameo139:5)")
    p.add_argument("--metric", choices=["tm", "contacts", "logits"],
                   help="tm (ESMFold), contacts (both), logits (ESM-2 LMs); default: tm for ESMFold, logits for LMs")
    p.add_argument("--unit", choices=["site", "layer", "part"], default="site",
                   help="what one unit is (default site; on ESMFold start with part, then layer: each unit is a "
                        "fold of every sequence)")
    p.add_argument("--complement", action="store_true",
                   help="also measure everything quantized except each unit (twice the forwards)")
    p.add_argument("--calib", default="casp14:50", help="calibration sequences (default casp14:50)")
    p.add_argument("--out", required=True, help="output folder (an earlier run with the same settings is resumed)")
    add_batch_size_option(p)
    p.add_argument("--num-recycles", type=int, help="ESMFold recycles (default: the model's)")
    add_calib_crop_option(p)
    add_model_options(p)
    add_runtime_options(p)
    add_json_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ptq_protein.recipes.presets import get_preset
    from ptq_protein.search.sensitivity import sensitivity

    get_preset(args.recipe)  # a typo fails before any model is loaded
    loaded = load_float_model(args, args.model)
    result = sensitivity(loaded.model, args.recipe, args.set_spec, metric=args.metric, unit=args.unit,
                         out_dir=args.out, calibration=args.calib, complement=args.complement,
                         batch_size=args.batch_size, num_recycles=args.num_recycles,
                         max_length=calib_crop(args, loaded.device),
                         model_info={"name": args.model, "weights": args.weights, "source": loaded.source,
                                     "sha256": loaded.source_sha256, "dtype": args.dtype or "float32",
                                     "seed": 0 if args.seed is None else args.seed})
    if args.json:
        print_json({"paths": result["paths"], "timing": result["timing"], "top": result["rows"][:10]})
        return 0
    rows, paths = result["rows"], result["paths"]
    print(f"{len(rows)} units ranked by {rows[0]['metric']} loss vs FP ({args.recipe}); top 5:")
    for row in rows[:5]:
        print(f"  {row['unit']:<48} loss {float(row['loss']):.4g}")
    for label, path in paths.items():
        print(f"{label}: {path if path is not None else 'skipped (matplotlib missing)'}")
    return 0
