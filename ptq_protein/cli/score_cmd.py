"""``ptq-protein score``: zero-shot variant effects of one sequence, as fair-esm's ``predict.py`` computes them."""

from __future__ import annotations

import argparse
from pathlib import Path

from ptq_protein.cli.common import add_runtime_options, input_notes, resolve_device, say_input_changes, show_progress
from ptq_protein.cli.models_arg import (
    MODEL_HELP,
    add_backend_option,
    add_model_options,
    artifact_identity,
    check_model_or_artifact,
    load_model_or_artifact,
)

EXAMPLES = """examples:
  ptq-protein score esm2_t33_650M_UR50D --sequence MKTAYIAKQR... --out singles.csv        # + singles.png heatmap
  ptq-protein score runs/650m-w8a8 --sequence MKTAYIAKQR... --dms BLAT_ECOLX.csv --out scored.csv
  ptq-protein score esm2_t33_650M_UR50D --sequence ... --dms dms.csv --offset-idx 24 --strategy wt-marginals \\
      --out scored.csv

Mutants read A24G: residue 24 (numbered from --offset-idx, default 1) is A in --sequence and becomes G;
A24G:C30T scores both (the marginal strategies add the two scores). With --dms the output is the CSV's
rows with one score column added; without it, every single mutant (mutant,SCORE) and a heatmap
(PNG, PDF, SVG beside the CSV; needs matplotlib).
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("score", help="variant effect scores of one sequence (fair-esm predict.py)",
                              description="Score mutants of a sequence with an ESM-2 or ESM C model or artifact: a DMS "
                                          "CSV's rows, or every single mutant with a heatmap.",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="an artifact folder from 'ptq-protein quantize', or " + MODEL_HELP)
    p.add_argument("--sequence", required=True, help="the wild-type sequence the mutants apply to")
    p.add_argument("--out", required=True, help="output CSV (refused if it exists, unless --force)")
    p.add_argument("--dms", metavar="CSV", help="deep mutational scan to score (never modified); without it, every "
                                                "single mutant is scored")
    add_scoring_options(p)
    p.add_argument("--score-col", metavar="NAME", help="name of the score column (default: MODEL_STRATEGY)")
    p.add_argument("--force", action="store_true", help="replace an existing --out (and its figures)")
    add_backend_option(p)
    add_model_options(p)
    add_runtime_options(p)
    p.set_defaults(func=run)


def add_scoring_options(p: argparse.ArgumentParser) -> None:
    """--strategy, --mutation-col, --offset-idx, --toks-per-batch (score and eval variants)."""
    from ptq_protein.workloads.score_strategy import DEFAULT_TOKS_PER_BATCH, Strategy

    p.add_argument("--strategy", default=Strategy.MASKED_MARGINALS.value, choices=[s.value for s in Strategy],
                   help="fair-esm predict.py's scoring strategy (default: masked-marginals)")
    p.add_argument("--mutation-col", default="mutant", help="the DMS column naming mutants (default: mutant)")
    p.add_argument("--offset-idx", type=int, default=1, metavar="N",
                   help="the number of a sequence's first residue in mutant names (default: 1; fair-esm's "
                        "predict.py defaults to 0)")
    p.add_argument("--toks-per-batch", type=int, default=DEFAULT_TOKS_PER_BATCH,
                   help=f"tokens per forward for the masked copies (default: {DEFAULT_TOKS_PER_BATCH})")


def run(args: argparse.Namespace) -> int:
    from ptq_protein.data.fasta import cleaning_note
    from ptq_protein.workloads.score_job import plan_scores, run_scores

    artifact = check_model_or_artifact(args, "score")
    column = args.score_col if args.score_col is not None else _default_column(args, artifact)
    job = plan_scores(args.sequence, args.strategy, args.out, column, dms=args.dms, mutation_col=args.mutation_col,
                      offset_idx=args.offset_idx, toks_per_batch=args.toks_per_batch, force=args.force)
    model, _identity = load_model_or_artifact(args, artifact, resolve_device(args.device))
    report = run_scores(model, job, progress=show_progress(args),
                        title=f"{column}, {len(job.sequence)} residues")
    print(f"scored {report.mutants} mutants ({job.strategy.value}) in {report.seconds:.1f} s into {report.csv}"
          + (f"; heatmap {report.figure}" if report.figure else ""))
    wild_type = {"--sequence": cleaning_note(args.sequence)}  # what reading changed: lower case, a terminal '*'
    say_input_changes("score", input_notes([("--sequence", args.sequence)], wild_type))
    return 0


def _default_column(args: argparse.Namespace, artifact: bool) -> str:
    """``MODEL_STRATEGY`` (predict.py names its column after the model); an artifact: its source model and recipe,
    or its folder's name when it does not record them."""
    name = Path(str(args.model).rstrip("/")).name or str(args.model)
    if artifact:
        identity = artifact_identity(args.model)
        if identity["source"] and identity["recipe"]:
            name = f"{identity['source']}-{identity['recipe']}"
    return f"{name}_{args.strategy}"
