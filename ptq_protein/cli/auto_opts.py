"""The ``quantize --auto`` options: budget, units, menu, search and held-out sequences."""

from __future__ import annotations

import argparse

from ptq_protein.cli.common import calib_crop


def add_auto_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("mixed precision (--auto)")
    g.add_argument("--budget", help="metric bound on held-out sequences: 'tm>=0.99', 'contacts>=0.95', "
                                    "'logits_rel<=0.02' or 'top1>=0.99'")
    g.add_argument("--max-bits-avg", type=float, metavar="B",
                   help="largest average bit width (mean of weight and activation widths, FP counted as 16)")
    g.add_argument("--metric", choices=["tm", "contacts", "logits"],
                   help="with only --max-bits-avg: what to keep close to FP (default tm for ESMFold, logits for LMs)")
    g.add_argument("--unit", choices=["site", "layer", "part"], default="layer",
                   help="unit of the plan (default layer)")
    g.add_argument("--choices", help="comma list of per-unit choices (e.g. w8a8-pwlq,w4a8-pwlq,w6a6-uniform) or "
                                     "'all'; default: FP, W8/W6/W4 with PWLQ A8/A6, and W8 uniform A8")
    g.add_argument("--search-set", default="cameo139:5", help="sequences the search measures (default cameo139:5)")
    g.add_argument("--holdout", default="cameo2022:5", help="held-out sequences the plan is verified on "
                                                             "(default cameo2022:5)")


def auto_budget(args: argparse.Namespace):
    """The parsed Budget for --auto (None without it); budget options without --auto are an error."""
    from ptq_protein.recipes.site_plan import parse_choices
    from ptq_protein.search.budget import Budget

    if not args.auto:
        if args.budget is not None or args.max_bits_avg is not None:
            raise ValueError("--budget and --max-bits-avg need --auto (they steer the mixed-precision search)")
        return None
    parse_choices(args.choices)
    return Budget.parse(args.budget, args.max_bits_avg)


def run_auto(args: argparse.Namespace, loaded, budget):
    from ptq_protein.recipes.site_plan import parse_choices
    from ptq_protein.search.auto import auto_quantize

    return auto_quantize(loaded.model, budget, calibration=args.calib, search_set=args.search_set,
                         holdout=args.holdout, unit=args.unit, choices=parse_choices(args.choices),
                         metric=args.metric, backend=args.backend, batch_size=args.batch_size,
                         num_recycles=args.num_recycles, max_length=calib_crop(args, loaded.device))
