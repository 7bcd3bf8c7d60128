"""``ptq-protein eval structure|contacts|variants``: a model and a list of recipes -> a results table on a set."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Dict

from ptq_protein.cli.common import (
    add_batch_size_option,
    add_calib_crop_option,
    add_duplicates_option,
    add_json_option,
    add_runtime_options,
    add_tm_normalize_option,
    calib_crop,
    print_json,
    resolve_device,
    show_progress,
)
from ptq_protein.cli.models_arg import MODEL_HELP, add_model_options, load_float_model

EXAMPLES = """examples:
  ptq-protein eval structure --model esmfold --recipes fp,w8a8-uniform,w8a8-pwlq --set cameo139 \\
      --calib casp14:50 --out runs/eval
  ptq-protein eval contacts --model esm2_t33_650M_UR50D --recipes fp,w8a8-pwlq --set cameo139 --out runs/contacts
  ptq-protein eval structure --model tiny-esmfold --recipes fp,w8a8-pwlq --set cameo139 --limit 5 --out runs/tiny
  ptq-protein eval structure --model esmfold --set my.fasta:natives/ --out runs/mine   # your own set
  ptq-protein eval variants --model esm2_t33_650M_UR50D --set blat.fasta --dms BLAT_ECOLX.csv --out runs/var

Outputs in --out: results.csv (one row per target x recipe), summary.md, fp_vs_quantized.png,
pdb/<recipe>/<target>.pdb (structure), contacts/<recipe>/<target>.npy (contacts) or
variants/<recipe>/<target>.npy (variants: every single mutant's score, [L, 20]), run.json.
Rerunning the same command resumes: finished rows are neither redone nor duplicated.
Across processes or GPUs (targets x recipes shared; resumable with any N):
  torchrun --nproc-per-node 4 -m ptq_protein.cli.main eval structure --model esmfold --device cuda --out runs/eval
"""

TINY_NOTE = ("tiny random model: these numbers check the toolkit end to end; they say nothing about "
             "proteins or about quantizing a trained model")


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="evaluate recipes on a benchmark set (structure, contacts, variants)",
                              description="Evaluate FP and quantized recipes on a benchmark set; resumable.",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="eval_kind", metavar="KIND", required=True)
    structure = sub.add_parser("structure", help="fold with ESMFold; TM-score, GDT, RMSD, lDDT, pLDDT, TM-fidelity",
                               epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(structure, default_recipes="fp,w8a8-uniform,w8a8-pwlq")
    structure.add_argument("--num-recycles", type=int, help="ESMFold recycles (default: the model's)")
    add_tm_normalize_option(structure)
    structure.set_defaults(func=run, eval_kind="structure")
    contacts = sub.add_parser("contacts", help="ESM-2 contact precision by separation range (long-range P@L)",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(contacts, default_recipes="fp,w8a8-pwlq")
    contacts.set_defaults(func=run, eval_kind="contacts", num_recycles=None, tm_normalize="native")
    _add_variants(sub)


def _add_variants(sub) -> None:
    from ptq_protein.cli.score_cmd import add_scoring_options

    variants = sub.add_parser("variants", help="variant effect scores: Spearman vs FP (drift) and vs a DMS",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(variants, default_recipes="fp,w8a8-pwlq")
    add_scoring_options(variants)
    variants.add_argument("--dms", metavar="CSV_OR_DIR",
                          help="deep mutational scans with a DMS_score column: one CSV (a set of one target) or a "
                               "folder of <target id>.csv; adds Spearman vs experiment")
    variants.set_defaults(func=run, eval_kind="variants", num_recycles=None, tm_normalize="native")


def _add_common(p: argparse.ArgumentParser, default_recipes: str) -> None:
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--recipes", default=default_recipes,
                   help=f"comma-separated preset names; fp is always added (default {default_recipes})")
    p.add_argument("--set", default="cameo139", dest="set_spec",
                   help="evaluation set: cameo139, cameo2022, casp14, NAME:N, or FASTA[:NATIVES_DIR] "
                        "(default cameo139)")
    p.add_argument("--calib", default="casp14:50",
                   help="calibration sequences: a bundled set spec or a FASTA (default casp14:50, the study's)")
    p.add_argument("--out", required=True, help="output folder (an earlier run there is resumed)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N targets of the set")
    p.add_argument("--targets", metavar="ID,...", help="only these target ids (in this order)")
    p.add_argument("--max-length", type=int, metavar="L",
                   help="length cap: longer targets are recorded as skipped (default: the model's limit, 1022)")
    add_duplicates_option(p)
    add_batch_size_option(p)
    add_calib_crop_option(p)
    add_model_options(p)
    add_runtime_options(p)
    add_json_option(p)


def run(args: argparse.Namespace) -> int:
    from ptq_protein.eval.bench.distributed import process_group
    from ptq_protein.eval.bench.runner import normalize_recipes

    recipes = normalize_recipes(args.recipes)  # validate before loading anything heavy
    if args.max_length is not None and args.max_length < 1:
        raise ValueError(f"--max-length {args.max_length} must be a positive number of residues")
    if Path(args.out).is_file() or not args.out.strip():
        raise ValueError(f"--out {args.out!r} must name a folder (an earlier run there is resumed)")
    bench = _select(args)
    task = _variants_task(args, bench) if args.eval_kind == "variants" else {}  # DMS files checked before loading
    device = resolve_device(args.device)
    with process_group(device) as ranks:  # one process unless launched by torchrun
        _label_logs(ranks)
        result = _evaluate(args, bench, recipes, ranks, task)
        if ranks.is_main:
            _report(args, result)
    counts = result["counts"]
    if counts["error"] and not counts["ok"]:  # nothing scored: the command failed, whatever the table holds
        print(f"ptq-protein eval: failed: every row run failed ({counts['error']}); the status column of "
              f"{result['results']} says why (a rerun retries them)", file=sys.stderr)
        return 1
    return 0


def _evaluate(args: argparse.Namespace, bench, recipes, ranks, task: Dict[str, Any]) -> Dict[str, Any]:
    from ptq_protein.eval.bench.results_store import INPUTS_KEY
    from ptq_protein.eval.bench.runner import RunOptions
    from ptq_protein.models.adapters import ESM2_MAX_RESIDUES
    from ptq_protein.passes.sequences import with_input_digests

    loaded = load_float_model(args, args.model, device=ranks.device(resolve_device(args.device)))
    cap = args.max_length if args.max_length is not None else (loaded.max_length or ESM2_MAX_RESIDUES)
    options = RunOptions(calibration=args.calib, max_length=cap, batch_size=args.batch_size,
                         num_recycles=args.num_recycles, progress=show_progress(args) and ranks.is_main,
                         calib_max_length=calib_crop(args, loaded.device), tm_normalize=args.tm_normalize)
    # What must match for a resumed run (recipes, targets, limit, length cap and number of ranks may change).
    run_info = {"model": args.model, "weights": args.weights, "model_source": loaded.source,
                "model_sha256": loaded.source_sha256, "set": _set_identity(args.set_spec),
                "calibration": args.calib, "calib_max_length": options.calib_max_length,
                "num_recycles": args.num_recycles, "dtype": args.dtype or "float32",
                "seed": 0 if args.seed is None else args.seed}
    run_info = with_input_digests(run_info, {"--calib": args.calib, "--set": args.set_spec,
                                             "--dms": getattr(args, "dms", None)}, INPUTS_KEY)
    note = TINY_NOTE if str(loaded.source).startswith("tiny:") else ""
    if args.eval_kind == "structure":
        from ptq_protein.eval.bench.structure_task import evaluate_structure as evaluate
    elif args.eval_kind == "contacts":
        from ptq_protein.eval.bench.contacts_task import evaluate_contacts as evaluate
    else:
        from ptq_protein.eval.bench.variants_task import evaluate_variants as evaluate
    return evaluate(loaded.model, bench, recipes, Path(args.out), options, run_info=run_info, note=note, ranks=ranks,
                    **task)


def _variants_task(args: argparse.Namespace, bench) -> Dict[str, Any]:
    """``evaluate_variants``' scoring options and DMS assays, every mutant parsed against its target."""
    from ptq_protein.eval.bench.dms_assays import load_assays
    from ptq_protein.eval.bench.variants_task import VariantOptions

    scoring = VariantOptions(args.strategy, args.toks_per_batch)
    assays = load_assays(args.dms, bench, args.mutation_col, args.offset_idx) if args.dms else {}
    return {"scoring": scoring, "assays": assays}


def _label_logs(ranks) -> None:
    """Under torchrun, each log line names its rank (the ranks share one stderr)."""
    if not ranks.shared:
        return
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(f"%(levelname)s rank {ranks.rank}/{ranks.world_size} "
                                               "%(name)s: %(message)s"))


def _select(args: argparse.Namespace):
    from ptq_protein.data.sets import load_set

    bench = load_set(args.set_spec, duplicates=args.duplicates)
    if args.targets:
        bench = bench.select([t.strip() for t in args.targets.split(",") if t.strip()])
    if args.limit is not None:
        bench = bench.limit(min(args.limit, len(bench)) if args.limit >= 1 else args.limit)
    return bench


def _set_identity(spec: str) -> str:
    """The set spec without its limit, so ``--limit``/``:N`` can grow a resumed run."""
    from ptq_protein.data.sets import parse_set_spec

    parsed = parse_set_spec(spec)
    return parsed.name or f"{parsed.fasta}:{parsed.natives or ''}"


def _report(args: argparse.Namespace, result: Dict[str, Any]) -> None:
    if args.json:
        print_json({k: str(v) if isinstance(v, Path) else v for k, v in result.items()})
        return
    counts = result["counts"]
    print(f"{counts['ok']} rows scored, {counts['skipped']} skipped (length cap), {counts['error']} failed, "
          f"{counts['resumed']} already done")
    for key in ("results", "summary", "plot"):
        print(f"{key}: {result[key]}")
